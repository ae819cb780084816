"""`tmpi bench` and `tmpi plot`: measured exchange, scaling and overhead."""

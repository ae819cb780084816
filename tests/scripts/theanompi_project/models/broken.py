"""A ModelClass missing val_iter."""
from models.mlp import MLP


class NoVal(MLP):
    val_iter = None

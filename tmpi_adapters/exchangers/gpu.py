"""GPU exchangers: device buffers over NCCL (CuPy) and CUDA-aware MPI."""

"""GPU targets (OpenCL, CUDA): the GPU back end (:mod:`tvm_ext.gpu.backend`)."""

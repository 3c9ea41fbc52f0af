/* The collective kernel for the emulated GPU: g++ compiles the CUDA source as C++ (dialect.h). */
#include "coll_kernel.cu"

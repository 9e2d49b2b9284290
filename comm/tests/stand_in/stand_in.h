/* Shared by the CPU stand-ins (cuda.c, nccl.c): what a stream is. A collective enqueued on a
 * stream runs on a thread of the stand-in NCCL and counts as pending work of that stream, so
 * cuStreamQuery reports CUDA_ERROR_NOT_READY until it has finished, as on a GPU. */
#include <stdatomic.h>

struct stand_in_stream {
    _Atomic int pending;
};

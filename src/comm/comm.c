/* comm.c - the backend-independent part of the communicator: element sizes
 * and op names used in statistics and messages. Nothing here is collective
 * and nothing here talks to MPI (see comm_mpi.c for the MPI backend). */
#include "loom/comm.h"

size_t loom_dtype_size(loom_dtype t) {
    switch (t) {
    case LOOM_F32: return 4;
    case LOOM_F64: return 8;
    case LOOM_I32: return 4;
    case LOOM_I64: return 8;
    case LOOM_U8: return 1;
    }
    return 0;
}

const char *loom_comm_op_name(loom_comm_op op) {
    switch (op) {
    case LOOM_OP_ALLREDUCE: return "allreduce";
    case LOOM_OP_REDUCE_SCATTER: return "reduce_scatter";
    case LOOM_OP_ALLGATHER: return "allgather";
    case LOOM_OP_ALLTOALL: return "alltoall";
    case LOOM_OP_ALLTOALLV: return "alltoallv";
    case LOOM_OP_SEND: return "send";
    case LOOM_OP_RECV: return "recv";
    case LOOM_OP_BCAST: return "bcast";
    case LOOM_OP_BARRIER: return "barrier";
    case LOOM_OP_COUNT: break;
    }
    return "unknown";
}

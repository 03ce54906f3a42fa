/* mesh.h - the device mesh: layout (dp, tp, pp, cp, ep) -> coordinates and groups.
 *
 * The world of N ranks is a 4-D grid tp x cp x dp x pp (N = tp*cp*dp*pp).
 * The order of axes, innermost first, is configurable; by default TP is
 * innermost (neighbouring ranks share the fastest links), then CP, DP, and PP
 * outermost. Worked example, 8 ranks, dp=2 tp=2 pp=2, order tp,cp,dp,pp:
 *
 *   rank:  0 1 2 3 4 5 6 7
 *   tp  :  0 1 0 1 0 1 0 1      tp groups {0,1} {2,3} {4,5} {6,7}
 *   dp  :  0 0 1 1 0 0 1 1      dp groups {0,2} {1,3} {4,6} {5,7}
 *   pp  :  0 0 0 0 1 1 1 1      pp groups {0,4} {1,5} {2,6} {3,7}
 *
 * rank = sum over axes of coord[axis] * stride[axis], stride of the innermost
 * axis 1 and each next axis the product of the sizes inside it. EP is not a
 * fifth factor: expert-parallel groups are formed inside the dp x cp
 * sub-mesh (ep must divide dp*cp), consecutive in that sub-mesh.
 *
 * Pure functions (layout checks, coordinates) need no MPI; loom_mesh_create is
 * collective over the world. Every group of the mesh is made by the device's
 * communicator factory (device.h: loom_device_comm_split), so it carries the
 * device's memory and the implementation the device chose (MPI on a CPU,
 * host-staged MPI or NCCL on a GPU): code above hands it tensors in that
 * device's memory, and host buffers (scalars, agreement) to
 * loom_comm_host(group). Nothing else makes groups for tensors.
 */
#ifndef LOOM_MESH_H
#define LOOM_MESH_H

#include <stddef.h>
#include "loom/comm.h"
#include "loom/device.h"
#include "loom/layout.h"
#include "loom/status.h"

/* The layout (degrees, order and the rest) and its checks are layout.h's:
 * loom_layout_default, loom_layout_parse_order, loom_layout_degree,
 * loom_layout_check. */

/* rank -> coordinates (indexed by loom_axis) and back; pure. The layout's
 * degrees and order must be valid (loom_layout_check). */
void loom_layout_coords(const loom_layout *l, int rank, int coords[LOOM_AXIS_COUNT]);
int loom_layout_rank(const loom_layout *l, const int coords[LOOM_AXIS_COUNT]);
/* Rank inside the dp x cp group (the members ordered by world rank, so the
 * inner of cp and dp counts fastest: cp_rank + cp * dp_rank by default).
 * The EP group is dpcp_rank / ep and ep_rank = dpcp_rank % ep. Pure. */
int loom_layout_dpcp_rank(const loom_layout *l, const int coords[LOOM_AXIS_COUNT]);

typedef struct loom_mesh {
    loom_layout layout;
    int rank, world_size;
    int coords[LOOM_AXIS_COUNT];
    int tp_rank, cp_rank, dp_rank, pp_rank, ep_rank;
    loom_comm *world; /* not owned: the job's MPI world, on host memory (host buffers only) */
    loom_comm *tp, *cp, *dp, *pp;
    loom_comm *dpcp;    /* dp x cp: the group that reduces gradients when cp > 1 */
    loom_comm *ep;      /* ep consecutive ranks of dpcp (see loom_layout_dpcp_rank) */
    loom_comm *edp;     /* ep > 1: the ranks of dpcp with this ep_rank, one per EP group (they hold
                        the same experts: the expert-data group); NULL at ep = 1 */
    loom_comm *pp_ends; /* pp > 1: the first and last stage of this rank's pipeline (the tied
                           embedding's two copies); NULL on the stages between and at pp = 1 */
} loom_mesh;

/* Collective over world. Calls loom_layout_check first, so every rank fails
 * the same way before any communication. Every axis group exists (size 1
 * for a degree of 1) and is named after its axis: "tp", "cp", "dp", "pp",
 * "dpcp", "ep"; then "edp" and "embed" (pp_ends) where the layout has them.
 * All are made through dev (loom_device_comm_split), which must outlive the
 * mesh. */
loom_status loom_mesh_create(loom_comm *world, const loom_layout *l, loom_device *dev, loom_mesh **out);
void loom_mesh_free(loom_mesh *m);
/* The comm of an axis (NULL for an axis out of range). */
loom_comm *loom_mesh_comm(const loom_mesh *m, loom_axis a);

/* The layout as a small text table (degrees, order, and rank -> coordinates
 * for up to 64 ranks), for `loom train` to print. Returns bytes written, not
 * counting the terminating NUL (the text is cut to fit cap). Pure. */
size_t loom_mesh_format(const loom_layout *l, int world_size, char *buf, size_t cap);

#endif

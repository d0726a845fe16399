/* Private pieces shared by the distributed layer's files. */
#ifndef CM_DIST_IMPL_H
#define CM_DIST_IMPL_H

#include <composer/dist.h>

/* The MPI backend (comm_mpi.c): makes the vtable's self. */
cm_status cmi_comm_mpi_backend_new(const cm_comm_config *cfg, const cm_comm_i **vt, void **self);

/* Sleeps or yields a little while polling; `spins` counts the polls so far. */
void cmi_dist_backoff(int64_t spins, double waited_s);

#endif

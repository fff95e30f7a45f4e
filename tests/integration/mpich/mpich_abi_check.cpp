// Compiled into the *_mpich test programs: fails the build when <mpi.h> is not MPICH's (an Open MPI
// include directory leaking into the ddp_mpich target would otherwise go unnoticed until link or run time).
// SPDX-License-Identifier: MIT
#include <mpi.h>

static_assert(MPICH_NUMVERSION >= 30000000, "ddp: the *_mpich tests must compile against MPICH's mpi.h (3.0 or "
              "newer); an Open MPI include directory leaked into the ddp_mpich target");

/* The MPI component's hook for the test suite (tests/test_mpi.c links the
 * static library). Not part of the shared library's ABI: nothing here is
 * exported from libmha_mpi.so. */
#ifndef MHA_MPI_TEST_HOOKS_H
#define MHA_MPI_TEST_HOOKS_H

/* This process's next n allocations in the MPI component succeed, the one
 * after fails (once); n < 0 disarms. Returns the number of allocations
 * made since the last call. */
long mha_mpi_test_fail_alloc_after(long n);

#endif

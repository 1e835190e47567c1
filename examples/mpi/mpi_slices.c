/* mpi_slices: the ranks of an MPI job on one node share one heap. Each rank
 * fills its slice of a named array; rank 0 names an index; all sync. A
 * later run reads it back and checks every element.
 *
 *   mpicc -o mpi_slices mpi_slices.c $(pkg-config --cflags --libs heapd)
 *   mpirun -np 4 ./mpi_slices write 100000
 *   mpirun -np 2 ./mpi_slices check           (any number of ranks) */
#include <heapd/heapd.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct slices_index {
  int64_t ranks;         /* how many ranks wrote */
  int64_t per_rank;      /* elements per rank */
  uint64_t array_offset; /* the array, by offset: a link any process follows */
};

static int fail(int rank, const char* what) {
  fprintf(stderr, "mpi_slices rank %d: %s: %s\n", rank, what, heapd_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int write = argc > 1 && strcmp(argv[1], "write") == 0;
  const int64_t per_rank = argc > 2 ? atoll(argv[2]) : 100000;

  heapd_attach_options options;
  heapd_attach_options_init(&options);
  options.create_if_missing = 1;
  options.max_size = (uint64_t)1 << 30;
  heapd_heap* heap = heapd_attach("mpi", &options);
  if (heap == NULL) return fail(rank, "attach");

  if (write) {
    heapd_array_info info = {HEAPD_INT64, 1, 0, {(uint64_t)(per_rank * size)}};
    int64_t* values = heapd_array(heap, "slices", &info, 1); /* one makes it, all find it */
    if (values == NULL) return fail(rank, "heapd_array slices");
    for (int64_t i = 0; i < per_rank; ++i) {
      values[rank * per_rank + i] = (int64_t)rank * 1000000000 + i;
    }
    if (rank == 0) {
      struct slices_index* index = heapd_named_malloc(heap, "slices_index", sizeof(*index));
      if (index == NULL) return fail(rank, "name the index");
      index->ranks = size;
      index->per_rank = per_rank;
      index->array_offset = heapd_offset(heap, values);
    }
    if (heapd_sync(heap) != 0) return fail(rank, "sync");
    MPI_Barrier(MPI_COMM_WORLD);
  } else {
    const struct slices_index* index = heapd_find(heap, "slices_index", NULL);
    if (index == NULL) return fail(rank, "find slices_index");
    const int64_t* values = heapd_pointer(heap, index->array_offset);
    int64_t wrong = 0;
    const int64_t total = index->ranks * index->per_rank;
    for (int64_t i = rank; i < total; i += size) { /* every element, shared out */
      const int64_t writer = i / index->per_rank;
      if (values[i] != writer * 1000000000 + i % index->per_rank) ++wrong;
    }
    int64_t all_wrong = 0;
    MPI_Reduce(&wrong, &all_wrong, 1, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      printf("mpi_slices: %lld elements of %lld ranks checked, %lld wrong\n", (long long)total,
             (long long)index->ranks, (long long)all_wrong);
    }
    if (rank == 0 && all_wrong != 0) MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (heapd_detach(heap) != 0) return fail(rank, "detach");
  MPI_Finalize();
  return 0;
}

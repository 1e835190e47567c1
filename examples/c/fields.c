/* fields: a C program keeping a 2-D field and a linked list in a heap.
 *
 *   cc -o fields fields.c $(pkg-config --cflags --libs heapd)
 *   ./fields write      # makes "c_u" (4 x 3 doubles, C order) and "c_list"
 *   ./fields check      # finds them, and Fortran's "f_u", and checks
 *
 * The heap is "fields" on $HEAPD_SOCKET's heapd (made if missing). */
#include <heapd/heapd.h>
#include <stdio.h>
#include <string.h>

struct node {
  uint64_t next; /* offset of the next node in the heap; 0: none */
  int64_t value;
};

static int fail(const char* what) {
  fprintf(stderr, "fields: %s: %s\n", what, heapd_last_error());
  return 1;
}

static int write_fields(heapd_heap* heap) {
  heapd_array_info info = {HEAPD_FLOAT64, 2, 0, {4, 3}};
  double* u = heapd_array(heap, "c_u", &info, 1);
  if (u == NULL) return fail("heapd_array c_u");
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 3; ++j) u[i * 3 + j] = i * 10 + j;
  }
  /* A list of three nodes, linked by offsets (each process maps the heap at
   * its own address). The head is named; the others are reached from it. */
  uint64_t next = 0;
  for (int value = 3; value >= 1; --value) {
    struct node* n = value == 1 ? heapd_named_malloc(heap, "c_list", sizeof(*n))
                                : heapd_malloc(heap, sizeof(*n));
    if (n == NULL) return fail("allocate a node");
    n->next = next;
    n->value = value;
    next = heapd_offset(heap, n);
  }
  return heapd_sync(heap) == 0 ? 0 : fail("heapd_sync");
}

static int check_fields(heapd_heap* heap) {
  heapd_array_info info;
  const double* u = heapd_find_array(heap, "c_u", &info);
  if (u == NULL) return fail("find c_u");
  if (info.rank != 2 || info.shape[0] != 4 || info.shape[1] != 3 || info.fortran_order) {
    fprintf(stderr, "fields: c_u has the wrong record\n");
    return 1;
  }
  for (int i = 0; i < 12; ++i) {
    if (u[i] != (i / 3) * 10 + i % 3) {
      fprintf(stderr, "fields: c_u[%d] is %g\n", i, u[i]);
      return 1;
    }
  }
  int64_t expected = 1;
  for (const struct node* n = heapd_find(heap, "c_list", NULL); n != NULL;
       n = heapd_pointer(heap, n->next)) {
    if (n->value != expected++) {
      fprintf(stderr, "fields: c_list holds %lld where %lld belongs\n", (long long)n->value,
              (long long)expected - 1);
      return 1;
    }
  }
  if (expected != 4) return fail("walk c_list");
  /* Made by the Fortran example, column-major: f_u(i, j) = i * 10 + j. */
  const double* f = heapd_find_array(heap, "f_u", &info);
  if (f != NULL) {
    if (!info.fortran_order || info.shape[0] != 3 || info.shape[1] != 4) {
      fprintf(stderr, "fields: f_u has the wrong record\n");
      return 1;
    }
    for (int j = 1; j <= 4; ++j) {
      for (int i = 1; i <= 3; ++i) {
        if (f[(j - 1) * 3 + (i - 1)] != i * 10 + j) {
          fprintf(stderr, "fields: f_u(%d, %d) is %g\n", i, j, f[(j - 1) * 3 + (i - 1)]);
          return 1;
        }
      }
    }
    printf("fields: f_u (from Fortran) checked\n");
  }
  printf("fields: c_u and c_list checked\n");
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 2 || (strcmp(argv[1], "write") != 0 && strcmp(argv[1], "check") != 0)) {
    fprintf(stderr, "usage: fields write|check\n");
    return 2;
  }
  heapd_attach_options options;
  heapd_attach_options_init(&options);
  options.create_if_missing = 1;
  options.max_size = (uint64_t)64 << 20;
  heapd_heap* heap = heapd_attach("fields", &options);
  if (heap == NULL) return fail("heapd_attach fields");
  const int rc = strcmp(argv[1], "write") == 0 ? write_fields(heap) : check_fields(heap);
  if (heapd_detach(heap) != 0) return fail("heapd_detach");
  return rc;
}

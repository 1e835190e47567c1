/* counter: a named counter in heap "counters" that every run increments.
 *   ./c_counter         prints the new value */
#include <heapd/heapd.h>
#include <stdint.h>
#include <stdio.h>

int main(void) {
  heapd_attach_options options;
  heapd_attach_options_init(&options);
  options.create_if_missing = 1;
  options.max_size = (uint64_t)1 << 30;
  heapd_heap* heap = heapd_attach("counters", &options);
  if (heap == NULL) {
    fprintf(stderr, "c_counter: %s\n", heapd_last_error());
    return 1;
  }
  uint64_t* runs = heapd_find(heap, "runs", NULL);
  if (runs == NULL) runs = heapd_named_malloc(heap, "runs", sizeof(*runs));
  if (runs == NULL) {
    fprintf(stderr, "c_counter: %s\n", heapd_last_error());
    return 1;
  }
  ++*runs;
  printf("runs %llu\n", (unsigned long long)*runs);
  return heapd_sync(heap) == 0 && heapd_detach(heap) == 0 ? 0 : 1;
}

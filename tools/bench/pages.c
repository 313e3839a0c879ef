#include "bench.h"
void mode_pages(void) {}

/* The headers as C89: compiled (not run) with cc -std=c89 -pedantic -Wall -Wextra -Werror by
 * crates/zonal/tests/suite/c_abi.rs, and with -DZONAL_TEST_NUMAB_FIRST by crates/numab's,
 * which includes zonal_numab.h first (it includes zonal.h itself). A header a C89 program cannot
 * include is one many C code bases cannot use: no // comments, nothing newer than C89. */
#ifdef ZONAL_TEST_NUMAB_FIRST
#include "zonal_numab.h"
#endif
#include "zonal.h"
#include "zonal_numab.h"

int main(void) {
    zonal_t *z = 0;
    zonal_numab_t *b = 0;
    void *p = 0;
    int err = zonal_create("topology=nodes=1,size=4M", &z);
    if (err == 0)
        err = zonal_alloc_pages_node(z, ZONAL_NUMA_NO_NODE, ZONAL_GFP_KERNEL | ZONAL_GFP_THISNODE, 0, &p);
    if (err == 0)
        err = zonal_free_pages(z, p, 0);
    if (err == 0 && zonal_abi_version() != ZONAL_ABI_VERSION)
        err = -1;
    if (err == 0)
        err = zonal_numab_create(z, "", &b);
    zonal_numab_destroy(b);
    zonal_destroy(z);
    return err == 0 ? 0 : 1;
}

/* NUMA balancing's C ABI end to end: a balancer over a handle, a region placed on first
 * touch by policy, a hint fault that moves a page to the faulting CPU's node, the counters,
 * every error, and everything freed. Needs two CPUs (CPU 0 on node 0, CPU 1 on node 1).
 * Exits 0 on success; on the first failure prints what and where and exits 1. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zonal.h"
#include "zonal_numab.h"

static int checks;

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        checks++;                                                                            \
        if (!(cond)) {                                                                       \
            char msg_[512];                                                                  \
            zonal_last_error(msg_, sizeof msg_);                                             \
            fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, __LINE__, \
                    #cond, msg_);                                                            \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

static void on_cpu(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    CHECK(sched_setaffinity(0, sizeof s, &s) == 0);
}

static uint64_t stat(zonal_numab_t *b, const char *name) {
    uint64_t v = 0;
    CHECK(zonal_numab_stat(b, name, &v) == 0);
    return v;
}

int main(void) {
    zonal_t *z = NULL;
    zonal_numab_t *b = NULL;
    zonal_region_t *r = NULL;
    char msg[512];

    CHECK(zonal_create("topology=nodes=2,size=16M,cpus=0:1", &z) == 0);

    /* Bad input: a negated errno and a message, nothing created. */
    CHECK(zonal_numab_create(NULL, "", &b) == -EINVAL && b == NULL);
    CHECK(zonal_numab_create(z, "mode=sideways", &b) == -EINVAL && b == NULL);
    CHECK(zonal_last_error(msg, sizeof msg) > 0 && strstr(msg, "sideways") != NULL);
    CHECK(zonal_numab_create(z, "scan_size_mb=lots", &b) == -EINVAL);
    /* No background collapse (collapse_mb=0): a pass between the scan and the access below
       would map the hinted pages again (a collapse drops hints, as khugepaged's does) and
       the access would fault nothing; collapse_now runs one when the test says. */
    CHECK(zonal_numab_create(z, "mode=delayed;scan_delay_ms=3600000;collapse_mb=0", &b) == 0 && b != NULL);
    CHECK(zonal_region_create(b, 0, "local", &r) == -EINVAL && r == NULL);
    CHECK(zonal_region_create(b, 4096, "preferred=9", &r) == -ENODEV && r == NULL);
    CHECK(zonal_region_create(b, 4096, "nearby", &r) == -EINVAL && r == NULL);
    CHECK(zonal_region_create(NULL, 4096, "local", &r) == -EINVAL);
    uint64_t v;
    CHECK(zonal_numab_stat(b, "no_such_counter", &v) == -EINVAL);

    /* A region: first touch on CPU 0 lands on node 0. */
    CHECK(zonal_region_create(b, 3 * 4096 + 1, "local", &r) == 0 && r != NULL);
    CHECK(zonal_region_len(r) == 4 * 4096);
    volatile uint64_t *p = zonal_region_addr(r);
    CHECK(zonal_region_page_to_nid(r, (const void *)p) == -1);
    CHECK(zonal_region_page_to_nid(r, (const char *)p + 4 * 4096) == -EFAULT);
    on_cpu(0);
    p[0] = 42;
    CHECK(p[0] == 42);
    CHECK(zonal_region_page_to_nid(r, (const void *)p) == 0);
    CHECK(stat(b, "numab_first_touch") == 1);
    CHECK(zonal_region_prefault(r, 4096, 4096) == 0);
    CHECK(zonal_region_page_to_nid(r, (const char *)p + 4096) == 0);
    CHECK(zonal_region_prefault(r, 0, 5 * 4096) == -EFAULT);

    /* A scan, then an access from CPU 1 (node 1): the page moves there, with its data. */
    CHECK(zonal_numab_scan_now(b) == 2);
    CHECK(stat(b, "numa_pte_updates") == 2);
    on_cpu(1);
    CHECK(p[0] == 42);
    CHECK(zonal_region_page_to_nid(r, (const void *)p) == 1);
    CHECK(stat(b, "numa_hint_faults") == 1 && stat(b, "numa_hint_faults_local") == 0);
    CHECK(stat(b, "numa_pages_migrated") == 1 && stat(b, "pgmigrate_success") == 1);
    p[0] = 43;
    CHECK(zonal_numab_scan_now(NULL) == -EINVAL);
    /* Pages 0 (node 1) and 1 (node 0) share no node: nothing to collapse. */
    CHECK(zonal_numab_collapse_now(b, 1024) == 0);
    CHECK(zonal_numab_collapse_now(NULL, 1) == -EINVAL);
    CHECK(stat(b, "numab_collapsed_pages") == 0);

    /* The allocator's reports carry the balancer's counters. */
    CHECK(zonal_vmstat(z, "numab_first_touch", &v) == 0 && v == 2);

    /* The allocator handle may go first: the balancer and the region keep it. */
    zonal_destroy(z);
    z = NULL;
    CHECK(p[0] == 43);

    zonal_region_destroy(r);
    zonal_region_destroy(NULL);
    zonal_numab_destroy(b);
    zonal_numab_destroy(NULL);
    printf("%d checks passed\n", checks);
    return 0;
}

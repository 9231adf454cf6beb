/* The C ABI end to end: create, allocate, free, every error, policies, bulk calls, reports,
 * the config keys, node ZONAL_NUMA_NO_NODE and the last error's lifetime.
 * Exits 0 on success; on the first failure prints what and where and exits 1. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "zonal.h"

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

/* Connects to a published handle's socket; -1 on failure. */
static int connect_to(const char *path) {
    struct sockaddr_un a;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    strncpy(a.sun_path, path, sizeof a.sun_path - 1);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static uint64_t free_pages(zonal_t *z, int nid) {
    uint64_t n = 0;
    CHECK(zonal_nr_free_pages(z, nid, &n) == 0);
    return n;
}

int main(void) {
    zonal_t *z = NULL;
    char msg[512];

    /* Bad configs: a negated errno and a message, nothing created. */
    CHECK(zonal_create("topology=nodes=2,size=8M;colour=red", &z) == -EINVAL);
    CHECK(zonal_last_error(msg, sizeof msg) > 0 && strstr(msg, "colour") != NULL);
    CHECK(zonal_create("topology=nodes=2,distance=10 20:30 10", &z) == -EINVAL);
    CHECK(zonal_last_error(msg, sizeof msg) > 0 && strstr(msg, "symmetric") != NULL);
    CHECK(zonal_create(NULL, &z) < 0);
    CHECK(z == NULL);

    /* stat_interval, the tunable's name, is the config key; stat_interval_ms, its old name,
       is still accepted; both are bounded as the tunable is. */
    char val[64];
    CHECK(zonal_create("topology=nodes=1,size=4M;stat_interval=250", &z) == 0);
    CHECK(zonal_sysctl_get(z, "stat_interval", val, sizeof val) == 3 && strcmp(val, "250") == 0);
    zonal_destroy(z);
    CHECK(zonal_create("topology=nodes=1,size=4M;stat_interval_ms=300", &z) == 0);
    CHECK(zonal_sysctl_get(z, "stat_interval", val, sizeof val) == 3 && strcmp(val, "300") == 0);
    zonal_destroy(z);
    z = NULL;
    CHECK(zonal_create("topology=nodes=1,size=4M;stat_interval=0", &z) == -EINVAL && z == NULL);
    CHECK(zonal_last_error(msg, sizeof msg) > 0 && strstr(msg, "stat_interval") != NULL);
    CHECK(zonal_create("topology=nodes=1,size=4M;stat_intervals=5", &z) == -EINVAL);
    CHECK(zonal_last_error(msg, sizeof msg) > 0 && strstr(msg, "unknown key `stat_intervals`") != NULL);
    CHECK(strstr(msg, "percpu_pagelist_high_fraction, stat_interval") != NULL);

    CHECK(zonal_abi_version() == ZONAL_ABI_VERSION);
    CHECK(zonal_create("topology=nodes=2,size=8M;max_order=10", &z) == 0 && z != NULL);
    /* Start from the buddy lists alone, so free counts are exact. */
    zonal_drain_all_pages(z);
    uint64_t free0 = free_pages(z, 0), free1 = free_pages(z, 1);
    CHECK(free0 == 2048 && free1 == 2048);

    /* Allocate on each node, write and read the memory. */
    void *p0 = NULL, *p1 = NULL, *big = NULL;
    CHECK(zonal_alloc_pages_node(z, 0, ZONAL_GFP_THISNODE, 0, &p0) == 0);
    CHECK(zonal_alloc_pages_node(z, 1, ZONAL_GFP_THISNODE, 0, &p1) == 0);
    CHECK(zonal_page_to_nid(z, p0) == 0 && zonal_page_to_nid(z, p1) == 1);
    memset(p0, 0xab, 4096);
    memset(p1, 0xcd, 4096);
    CHECK(((unsigned char *)p0)[4095] == 0xab && ((unsigned char *)p1)[0] == 0xcd);
    CHECK(zonal_alloc_pages(z, 0, 3, &big) == 0);
    memset(big, 1, 8 * 4096);

    /* Errors, each a distinct errno, each changing nothing. */
    void *q = NULL;
    int on_stack = 0;
    CHECK(zonal_alloc_pages_node(z, 7, 0, 0, &q) == -ENODEV);
    /* A bad node is named as the caller passed it (it was clamped, and named 65535). */
    CHECK(zonal_alloc_pages_node(z, -2, 0, 0, &q) == -ENODEV);
    CHECK(zonal_last_error(msg, sizeof msg) > 0 && strstr(msg, "invalid node -2:") != NULL);
    CHECK(strstr(msg, "65535") == NULL && strstr(msg, "nodes 0..2") != NULL);
    CHECK(zonal_alloc_pages_node(z, 1 << 30, 0, 0, &q) == -ENODEV);
    CHECK(zonal_last_error(msg, sizeof msg) > 0 && strstr(msg, "invalid node 1073741824:") != NULL);
    CHECK(zonal_alloc_pages_node(z, -2147483647 - 1, 0, 0, &q) == -ENODEV);
    CHECK(zonal_last_error(msg, sizeof msg) > 0 && strstr(msg, "invalid node -2147483648:") != NULL);
    uint64_t untouched = 12345;
    CHECK(zonal_nr_free_blocks(z, -3, 0, &untouched) == -ENODEV);
    CHECK(zonal_last_error(msg, sizeof msg) > 0 && strstr(msg, "invalid node -3:") != NULL);
    CHECK(q == NULL && untouched == 12345);
    /* The last error is errno-like: a later successful call leaves it as it was. */
    CHECK(zonal_alloc_pages(z, ZONAL_GFP_KERNEL, 0, &q) == 0 && zonal_free_pages(z, q, 0) == 0);
    CHECK(zonal_nr_free_pages(z, 0, &untouched) == 0);
    CHECK(zonal_last_error(msg, sizeof msg) > 0 && strstr(msg, "invalid node -3:") != NULL);
    q = NULL;
    CHECK(zonal_alloc_pages(z, 0, 11, &q) == -EDOM);
    CHECK(zonal_alloc_pages(z, 0x80, 0, &q) == -EINVAL);
    CHECK(zonal_free_pages(z, &on_stack, 0) == -EFAULT);
    CHECK(zonal_free_pages(z, NULL, 0) == -EFAULT);
    CHECK(zonal_free_pages(z, (char *)p0 + 1, 0) == -EINVAL);
    CHECK(zonal_free_pages(z, big, 2) == -ERANGE);
    CHECK(zonal_free_pages(z, (char *)big + 4096, 0) == -ENOTBLK);
    CHECK(zonal_page_to_nid(z, &on_stack) == -EFAULT);
    CHECK(zonal_free_pages(z, p0, 0) == 0);
    CHECK(zonal_free_pages(z, p0, 0) == -EALREADY);
    CHECK(zonal_free_pages(z, p1, 0) == 0);
    CHECK(zonal_free_pages(z, big, 3) == 0);

    /* Policies. */
    CHECK(zonal_set_policy(z, "interleave") == 0);
    void *a = NULL, *b = NULL;
    CHECK(zonal_alloc_pages(z, 0, 0, &a) == 0 && zonal_alloc_pages(z, 0, 0, &b) == 0);
    CHECK(zonal_page_to_nid(z, a) != zonal_page_to_nid(z, b));
    CHECK(zonal_free_pages(z, a, 0) == 0 && zonal_free_pages(z, b, 0) == 0);
    CHECK(zonal_set_policy(z, "bogus") == -EINVAL);
    CHECK(zonal_set_policy(z, "preferred=9") == -ENODEV);
    CHECK(zonal_set_policy(z, "bind=1") == 0);
    CHECK(zonal_alloc_pages(z, 0, 0, &a) == 0 && zonal_page_to_nid(z, a) == 1);
    CHECK(zonal_free_pages(z, a, 0) == 0);
    CHECK(zonal_set_policy(z, "local") == 0);

    /* Bulk, array form: only the NULL slots are filled; the count of filled slots returns. */
    void *arr[64] = {0};
    void *kept = NULL;
    CHECK(zonal_alloc_pages(z, 0, 0, &kept) == 0);
    arr[5] = kept;
    CHECK(zonal_alloc_pages_bulk_array(z, 0, arr, 64) == 64);
    CHECK(arr[5] == kept);
    for (int i = 0; i < 64; i++) {
        CHECK(arr[i] != NULL);
        for (int j = 0; j < i; j++) CHECK(i == 5 || j == 5 || arr[i] != arr[j]);
    }
    arr[5] = NULL;
    CHECK(zonal_alloc_pages_bulk_array(z, 0, arr, 64) == 64);
    CHECK(zonal_free_pages(z, kept, 0) == 0);
    size_t bad = 99;
    CHECK(zonal_free_pages_bulk(z, (void *const *)arr, 64, &bad) == 0 && bad == 99);

    /* Bulk, list form, and a bulk free with one bad entry: the rest are still freed. */
    void *list[32];
    CHECK(zonal_alloc_pages_bulk_list(z, 0, 32, list) == 32);
    void *saved = list[7];
    list[7] = &on_stack;
    CHECK(zonal_free_pages_bulk(z, (void *const *)list, 32, &bad) == -EFAULT && bad == 7);
    CHECK(zonal_free_pages(z, saved, 0) == 0);
    CHECK(zonal_alloc_pages_bulk_list(z, 0, 0, list) == 0);

    /* Reports, snprintf-style. */
    int kinds[3] = {ZONAL_REPORT_ZONEINFO, ZONAL_REPORT_BUDDYINFO, ZONAL_REPORT_ZONES_JSON};
    for (int k = 0; k < 3; k++) {
        int len = zonal_report(z, kinds[k], NULL, 0);
        CHECK(len > 0);
        char *buf = malloc((size_t)len + 1);
        CHECK(buf != NULL);
        CHECK(zonal_report(z, kinds[k], buf, (size_t)len + 1) == len);
        CHECK(strlen(buf) == (size_t)len);
        if (kinds[k] == ZONAL_REPORT_ZONES_JSON)
            CHECK(buf[0] == '[');
        else
            CHECK(strncmp(buf, "Node 0, zone   Normal", 21) == 0);
        char tiny[8];
        CHECK(zonal_report(z, kinds[k], tiny, sizeof tiny) == len);
        CHECK(tiny[7] == '\0' && strlen(tiny) == 7);
        free(buf);
    }
    CHECK(zonal_report(z, 42, msg, sizeof msg) == -EINVAL);

    /* Tunables: get, set, reject with the old value kept. */
    CHECK(zonal_sysctl_set(z, "watermark_scale_factor", "300") == 0);
    CHECK(zonal_sysctl_get(z, "watermark_scale_factor", val, sizeof val) == 3 && strcmp(val, "300") == 0);
    CHECK(zonal_sysctl_set(z, "watermark_scale_factor", "0") == -EINVAL);
    CHECK(zonal_last_error(msg, sizeof msg) > 0 && strstr(msg, "1..=3000") != NULL);
    CHECK(zonal_sysctl_get(z, "watermark_scale_factor", val, sizeof val) == 3 && strcmp(val, "300") == 0);
    CHECK(zonal_sysctl_get(z, "nosuch", val, sizeof val) == -EINVAL);
    CHECK(zonal_sysctl_set(z, "percpu_pagelist_high_fraction", "7") == -EINVAL);
    CHECK(zonal_sysctl_set(z, "percpu_pagelist_high_fraction", "8") == 0);
    CHECK(zonal_sysctl_set(z, "numa_stats_mode", "Strict") == 0);
    CHECK(zonal_sysctl_get(z, "numa_stats_mode", val, sizeof val) == 6 && strcmp(val, "strict") == 0);
    CHECK(zonal_sysctl_set(z, "numa_stats_mode", "sometimes") == -EINVAL);
    CHECK(zonal_alloc_pages_node(z, 1, ZONAL_GFP_THISNODE, 0, &a) == 0 && zonal_free_pages(z, a, 0) == 0);
    char table[1024];
    CHECK(zonal_report(z, ZONAL_REPORT_NUMASTAT, table, sizeof table) > 0);
    CHECK(strstr(table, "node1") != NULL && strstr(table, "numa_hit") != NULL);

    /* vmstat: by name, and the reports in the kernel's, JSON and Prometheus layouts. */
    uint64_t hits = 0, pgfree = 0, free_now = 0;
    CHECK(zonal_vmstat(z, "numa_hit", &hits) == 0 && hits >= 1);
    CHECK(zonal_vmstat(z, "pgfree", &pgfree) == 0 && pgfree > 0);
    CHECK(zonal_refresh_vm_stats(z) == 0);
    CHECK(zonal_vmstat(z, "nr_free_pages", &free_now) == 0 && free_now > 0);
    CHECK(zonal_vmstat(z, "nr_nothing", &free_now) == -EINVAL);
    CHECK(zonal_last_error(msg, sizeof msg) > 0 && strstr(msg, "nr_free_pages") != NULL);
    CHECK(zonal_vmstat(z, "pgfree", NULL) == -EINVAL);
    static char report[1 << 16];
    CHECK(zonal_report(z, ZONAL_REPORT_VMSTAT, report, sizeof report) > 0);
    CHECK(strncmp(report, "nr_free_pages ", 14) == 0 && strstr(report, "\npgfree ") != NULL);
    CHECK(zonal_report(z, ZONAL_REPORT_VMSTAT_JSON, report, sizeof report) > 0 && report[0] == '{');
    CHECK(zonal_report(z, ZONAL_REPORT_PROMETHEUS, report, sizeof report) > 0);
    CHECK(strstr(report, "# TYPE zonal_vmstat_pgfree untyped") != NULL);
    CHECK(strstr(report, "zonal_zoneinfo_numa_hit_total{node=\"1\",zone=\"Normal\"}") != NULL);
    CHECK(zonal_report(z, ZONAL_REPORT_ZONEINFO, report, sizeof report) > 0);
    CHECK(strstr(report, "  pagesets\n    cpu: 0\n") != NULL && strstr(report, "vm stats threshold: ") != NULL);

    /* Everything back: the same free counts as at the start. */
    CHECK(zonal_drain_all_pages(z) >= 0);
    CHECK(free_pages(z, 0) == free0 && free_pages(z, 1) == free1);
    uint64_t blocks = 0;
    CHECK(zonal_nr_free_blocks(z, 0, 10, &blocks) == 0 && blocks == 2);
    CHECK(zonal_nr_free_blocks(z, 0, 11, &blocks) == -EDOM);
    CHECK(zonal_nr_free_pages(z, 5, &blocks) == -ENODEV);

    zonal_destroy(z);
    zonal_destroy(NULL);

    /* ZONAL_NUMA_NO_NODE (-1): the calling CPU's node, in every node-taking call. Here every
       CPU is on node 1 (node 0 is memory-only; CPU ids past the list map onto CPU 0's node),
       so the answer is node 1 wherever this thread runs, and never node 0. */
    CHECK(ZONAL_NUMA_NO_NODE == -1 && ZONAL_GFP_KERNEL == 0);
    CHECK(zonal_create("topology=nodes=2,size=8M,cpus=:0", &z) == 0);
    void *local0 = NULL, *local3 = NULL;
    CHECK(zonal_alloc_pages_node(z, ZONAL_NUMA_NO_NODE, ZONAL_GFP_THISNODE, 0, &local0) == 0);
    CHECK(zonal_alloc_pages_node(z, ZONAL_NUMA_NO_NODE, ZONAL_GFP_KERNEL, 3, &local3) == 0);
    CHECK(zonal_page_to_nid(z, local0) == 1 && zonal_page_to_nid(z, local3) == 1);
    zonal_drain_all_pages(z);
    uint64_t on_local = 0, on1 = 0, on0 = 0, blocks_local = 0, blocks1 = 0, blocks0 = 0;
    CHECK(zonal_nr_free_pages(z, ZONAL_NUMA_NO_NODE, &on_local) == 0);
    CHECK(zonal_nr_free_pages(z, 1, &on1) == 0 && zonal_nr_free_pages(z, 0, &on0) == 0);
    CHECK(on_local == on1 && on1 == on0 - 9);
    /* Node 1 has split blocks (the frame's buddy at least), node 0 only whole ones. */
    CHECK(zonal_nr_free_blocks(z, ZONAL_NUMA_NO_NODE, 0, &blocks_local) == 0);
    CHECK(zonal_nr_free_blocks(z, 1, 0, &blocks1) == 0 && zonal_nr_free_blocks(z, 0, 0, &blocks0) == 0);
    CHECK(blocks_local == blocks1 && blocks1 >= 1 && blocks0 == 0);
    CHECK(zonal_free_pages(z, local0, 0) == 0 && zonal_free_pages(z, local3, 3) == 0);
    zonal_destroy(z);
    /* Live introspection from C, with SIGPIPE at its default (C programs do not ignore it):
       clients that leave before their reply must not kill the process. */
    {
        char dir[128], path[256], reply[4096];
        int i, fd;
        ssize_t n, got = 0;
        struct sigaction sa;
        CHECK(sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL);
        snprintf(dir, sizeof dir, "/tmp/zonal-c-test-%ld", (long)getpid());
        CHECK(setenv("ZONAL_RUNTIME_DIR", dir, 1) == 0);
        CHECK(zonal_create("topology=nodes=2,size=8M;publish=1", &z) == 0);
        n = zonal_publish(z, path, sizeof path);
        CHECK(n > 0 && (size_t)n < sizeof path && strncmp(path, dir, strlen(dir)) == 0);
        CHECK(access(path, F_OK) == 0);
        for (i = 0; i < 20; i++) {
            fd = connect_to(path);
            CHECK(fd >= 0);
            CHECK(write(fd, "zoneinfo\n", 9) == 9);
            close(fd);
        }
        fd = connect_to(path);
        CHECK(fd >= 0 && write(fd, "info\n", 5) == 5);
        while ((n = read(fd, reply + got, sizeof reply - 1 - got)) > 0) got += n;
        close(fd);
        reply[got] = 0;
        CHECK(strncmp(reply, "ok\n{", 4) == 0 && strstr(reply, "\"nodes\":2") != NULL);
        CHECK(zonal_unpublish(z) == 1 && zonal_unpublish(z) == 0);
        CHECK(access(path, F_OK) != 0);
        CHECK(zonal_unpublish(NULL) == -EINVAL && zonal_publish(NULL, path, sizeof path) == -EINVAL);
        zonal_destroy(z);
        rmdir(dir);
        CHECK(zonal_create("topology=nodes=1,size=8M;publish=maybe", &z) == -EINVAL);
    }
    printf("zonal C ABI: %d checks passed\n", checks);
    return 0;
}

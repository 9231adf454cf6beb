// zonal.h from C++: compiled with c++ -Wall -Wextra -Werror, linked against libzonal.so and
// run by crates/zonal/tests/suite/c_abi.rs. The header's extern "C" block is written by hand
// (cbindgen's own uses // comments, which C89 rejects): without it these calls would link
// against C++-mangled names and fail.
#include <cstdio>

#include "zonal.h"

int main() {
    zonal_t *z = nullptr;
    if (zonal_create("topology=nodes=1,size=4M", &z) != 0) return 1;
    void *p = nullptr;
    int err = zonal_alloc_pages(z, ZONAL_GFP_KERNEL, 0, &p);
    if (err == 0) err = zonal_free_pages(z, p, 0);
    zonal_destroy(z);
    if (err != 0 || zonal_abi_version() != ZONAL_ABI_VERSION) return 1;
    std::puts("zonal.h from C++: ok");
    return 0;
}

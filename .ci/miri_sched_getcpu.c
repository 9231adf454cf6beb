/* sched_getcpu for Miri, which has no shim of its own for it: `.ci/hardening` builds this
 * into a shared library and hands it to Miri with -Zmiri-native-lib, so that the per-CPU
 * list tests can build a Zone (its counters ask which CPU they run on). Only this symbol is
 * in the library, so every other foreign call still goes to Miri's own shims. Every thread
 * is on CPU 0: zonal uses the CPU number only to choose which lists and counters to try. */
int sched_getcpu(void) { return 0; }

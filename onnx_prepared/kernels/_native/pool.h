/* The extension's intra-op thread pool (one per process, pthreads). */
#ifndef ONNX_PREPARED_POOL_H
#define ONNX_PREPARED_POOL_H

#include <stddef.h>

typedef void (*nb_task_fn)(void *ctx, int task);

/* Run fn(ctx, 0..ntasks-1) and return when all are done. The caller takes tasks too. A caller that
 * finds the pool busy (another thread's call in flight) runs every task itself: never blocks, never
 * oversubscribes. Call without the GIL. */
void nb_pool_run(nb_task_fn fn, void *ctx, int ntasks);
/* Threads used per call, the caller included (>= 1); waits for a call in flight, then resizes. */
void nb_pool_set_threads(int n);
int nb_pool_get_threads(void);
/* How long an idle worker spins before sleeping on its condition variable. */
void nb_pool_set_spin_us(int us);
/* The idle workers' whole wait policy: spin_us of pause, yield_us of sched_yield polling, then sleep (steer:
 * with the caller's CPU excluded from the sleeper's affinity). */
void nb_pool_set_wait(int spin_us, int yield_us, int steer);
void nb_pool_get_wait(int out[3]);
int nb_pool_default_threads(void);
/* Jobs a worker declined so far because the scheduler woke it on the caller's CPU. */
long long nb_pool_stalls(void);
/* Diagnostics since import: pooled jobs, declined, worker joins, tasks run by workers, tasks of pooled jobs,
 * jobs run by the caller alone during a back-off (pool.c). */
void nb_pool_stats(long long out[6]);
/* More diagnostics since import: worker wake-ups, their summed latency (ns from the job's publication to
 * the worker copying it), wake-ups found while spinning, declines that moved off the caller's CPU and then
 * joined, joins that found every task taken (pool.c). */
void nb_pool_diag(long long out[5]);
/* Test hook: one job of two tasks that wait at a gate for each other (up to timeout_ns), published once
 * every worker sleeps when asleep != 0. out: a worker ran a task at the same time as the caller (1/0), the
 * CPUs in that worker's affinity during the task, and after the job (0 when no worker ran). */
void nb_pool_probe(long long timeout_ns, int asleep, int out[3]);
/* This thread's scratch of at least n floats (NULL when out of memory), grown on demand and kept for the
 * thread's life: one buffer per thread shared by every kernel's tasks, so a task uses it only until it
 * returns. */
float *nb_scratch(size_t n);

#endif

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
int nb_pool_default_threads(void);
/* Jobs a worker declined so far because the scheduler woke it on the caller's CPU. */
long long nb_pool_stalls(void);
/* Diagnostics since import: pooled jobs, declined, worker joins, tasks run by workers, tasks of pooled jobs,
 * jobs run by the caller alone during a back-off (pool.c). */
void nb_pool_stats(long long out[6]);
/* This thread's scratch of at least n floats (NULL when out of memory), grown on demand and kept for the
 * thread's life: one buffer per thread shared by every kernel's tasks, so a task uses it only until it
 * returns. */
float *nb_scratch(size_t n);

#endif

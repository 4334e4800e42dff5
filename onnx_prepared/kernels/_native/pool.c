/* A small fork-safe pthread pool: after a job, workers spin briefly (spin_us, default 50 us), then poll
 * with sched_yield (yield_us, default 1 ms), then sleep on a condition variable, so an idle pool never
 * keeps a core from the I/O and prepack threads: a yielding poller gives its CPU to any runnable thread
 * at once, and sleeps for good 1 ms after the last job. Jobs are published under the mutex; a job's
 * tasks are taken with an atomic counter (dynamic balance on a shared, noisy machine). */
#define _GNU_SOURCE
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    int nthreads;   /* per call, caller included; 0 = not yet chosen */
    int nworkers;   /* started worker threads */
    pthread_t *tids;
    atomic_int stop;
    int spin_us;    /* an idle worker spins this long (pause), */
    int yield_us;   /* then polls with sched_yield this long, then sleeps */
    int steer;      /* a sleeping worker's affinity excludes the caller's CPU */
    atomic_int busy; /* a call holds the pool */
    atomic_ulong gen; /* bumped when a job is published (under mu) */
    /* the current job (written under mu while no worker is inside: inflight == 0) */
    nb_task_fn fn;
    void *ctx;
    int ntasks;
    atomic_int next, done;
    int inflight;      /* workers that copied the job and may still take tasks (under mu) */
    atomic_int caller_waits; /* the caller sleeps on cv_done (set under mu; see the NOTE on the hand-off) */
    int caller_cpu;    /* the caller's CPU when it published the job (under mu) */
    atomic_llong stalls; /* jobs a worker declined because it woke on the caller's CPU (diagnostics) */
    atomic_llong jobs, joined, wtasks, ttasks; /* diagnostics: pooled jobs, worker joins, tasks run by workers, all tasks */
    atomic_llong solo;  /* diagnostics: jobs the caller ran alone because the workers had not helped lately */
    long long solo_until; /* back-off (caller side, under busy): run jobs alone until this time (ns) */
    int streak;           /* consecutive judged jobs the workers did not shorten */
    long long last_bad;   /* when the last such job ended (ns) */
    long long pub_ns;     /* when the current job was published (under mu) */
    /* diagnostics (nb_pool_diag): worker wake-ups, summed ns from publish to the worker copying the job, of
     * those found while spinning; declines that moved off the caller's CPU; joins that found no task left */
    atomic_llong d_wakes, d_wake_ns, d_spun, d_moved, d_late;
    atomic_int probing; /* nb_pool_probe's job is in flight: the worker records its mask after the job */
    int probe_mask; /* CPUs in the worker's mask after that job (under mu) */
    atomic_int sleepers; /* workers waiting on cv_work (changed under mu; see the NOTE on the hand-off) */
} P = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv_work = PTHREAD_COND_INITIALIZER, .cv_done = PTHREAD_COND_INITIALIZER,
       .spin_us = 50, .yield_us = 1000, .steer = 1};

/* NOTE: a worker woken while every other CPU is busy (another process, another library's spinning
 * threads) is placed by the scheduler on the caller's own CPU, where it would only preempt the caller;
 * such a worker declines the job (the caller runs every task) and sleeps again without spinning. A
 * worker the scheduler placed on a free CPU joins; one placed on a busy CPU may join and then be
 * preempted while it holds a task, which the back-off below catches. (Pinning the workers off the
 * caller's CPU instead, so that they compete for a share of a busy CPU, was measured at load 4-6: calls
 * on 2 threads took up to 2x one thread's time; a likely cause, not verified, is the scheduler moving the
 * caller onto its own worker's CPU.) */

/* NOTE (the wait policy; measured on the 2-vCPU AVX2 EPYC under Firecracker, PREEMPT_NONE, HZ 250, in an
 * autogroup of nice -19 so that the other processes of a shared machine hardly ran): a worker woken from
 * its condition variable took 16-28 us on average from the job's publication to taking it, 80-170 us after
 * 2 ms idle (the vCPU halts), against 3-5 us for one still polling. In a model's forward the gaps between
 * pooled jobs are the Python dispatch of the ops between them, 20-400 us, longer than the 50 us spin:
 * every job paid a wake-up, and a short job (a decode step's M=1 MatMulNBits, 100-300 us) ran its first
 * tasks on the caller alone. Polling with sched_yield for 1 ms after a job keeps the worker ready through
 * a forward (a 200 us job of 16 tasks between 100 us of caller work: 2-thread speed-up 1.37 -> 1.48; the
 * medium INT4 LLM's decode step at level 4: 1.44 -> 1.72, prefill of 16 tokens unchanged within noise)
 * while any runnable thread (I/O, prepack, another process) still gets the CPU at the next poll; while
 * preparation holds CPU slots threads.py gives the pool fewer threads, so a 2-core machine has no poller
 * on the cold path.
 *
 * NOTE (steering): a worker that sleeps has its affinity without the caller's CPU (that of its last job)
 * until it has run its next job, so the wake-up cannot place it on the caller's CPU, where it would only
 * preempt the caller or decline (see below); restored after the job, the mask never pins it for longer
 * than one job. A caller that moved meanwhile is caught by the decline below. Alone (no polling) it gave
 * the decode step above 1.44 -> 1.67. */

/* NOTE (the hand-off): the caller writes a job under mu and bumps gen after unlocking, so a spinning worker
 * that sees it finds mu free (bumped under mu, the worker's lock met the caller's critical section, and a
 * contended lock sleeps in the kernel); it broadcasts cv_work only when a worker sleeps (sleepers; the two
 * sides' seq_cst store-then-load orders make one of them see the other). At the end the worker that
 * finishes the last task signals cv_done only when the caller sleeps on it (caller_waits, the same pairing
 * with done), and a caller that saw every task done while spinning takes no lock. Measured on this 2-vCPU
 * Xeon, K=1024 N=1024 M=1 warm (timeit best of 7x2000, old vs new alternated 3x, load ~1.3): level 4
 * 8.84-9.08 -> 8.15-8.30 us, level 0 12.5-12.8 -> 12.1 us. */

/* the workers' thread name (benchmarks/kernels_nbits.py reads their run-queue waits by it) */
#define POOL_THREAD_NAME "nb-pool"

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int nb_pool_default_threads(void)
{
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* NOTE: a worker the scheduler woke on the caller's CPU stays there: its previous CPU and the waker's
 * CPU are then the same, and where the two vCPUs share no cache domain the wake-up never looks at the
 * idle one. Measured on a quiet 2-vCPU machine: after the first decline every later job was declined
 * (50 of 50, no gain from the second thread) until the workers were restarted. So a declining worker
 * moves itself off the caller's CPU (its affinity without that CPU, then the old affinity back: the
 * move sticks, the mask does not), and, if it landed elsewhere, joins the job it woke for. Its next
 * wake-up starts from that CPU; if another process keeps that CPU busy, the back-off below catches the
 * straggler. */
static int leave_cpu(int cpu)
{
#ifdef CPU_COUNT
    cpu_set_t old, off;
    if (cpu < 0 || sched_getaffinity(0, sizeof(old), &old) != 0) return 0;
    off = old;
    CPU_CLR(cpu, &off);
    if (CPU_COUNT(&off) == 0 || sched_setaffinity(0, sizeof(off), &off) != 0) return 0;
    sched_setaffinity(0, sizeof(old), &old);
    return sched_getcpu() != cpu;
#else
    (void)cpu;
    return 0;
#endif
}

/* take and run tasks of the current job until none is left */
static int run_tasks(nb_task_fn fn, void *ctx, int ntasks)
{
    for (int n = 0;; n++) {
        int t = atomic_fetch_add_explicit(&P.next, 1, memory_order_relaxed);
        if (t >= ntasks) return n;
        fn(ctx, t);
        if (atomic_fetch_add(&P.done, 1) + 1 == ntasks && atomic_load(&P.caller_waits)) {
            pthread_mutex_lock(&P.mu);
            pthread_cond_signal(&P.cv_done);
            pthread_mutex_unlock(&P.mu);
        }
    }
}

static int mask_count(void)
{
#ifdef CPU_COUNT
    cpu_set_t m;
    if (sched_getaffinity(0, sizeof(m), &m) == 0) return CPU_COUNT(&m);
#endif
    return 0;
}

#ifdef CPU_COUNT
typedef cpu_set_t nb_mask;
#else
typedef int nb_mask;
#endif

static void restore_mask(const nb_mask *saved)
{
#ifdef CPU_COUNT
    sched_setaffinity(0, sizeof(*saved), saved);
#else
    (void)saved;
#endif
}

/* Before a worker sleeps: its affinity without the caller's CPU (see the NOTE on steering), the old mask in
 * *saved. Returns whether it changed the mask (then restore_mask(saved) after the next job). */
static int steer_off(int cpu, nb_mask *saved)
{
#ifdef CPU_COUNT
    cpu_set_t off;
    if (cpu < 0 || sched_getaffinity(0, sizeof(*saved), saved) != 0 || !CPU_ISSET(cpu, saved)) return 0;
    off = *saved;
    CPU_CLR(cpu, &off);
    return CPU_COUNT(&off) > 0 && sched_setaffinity(0, sizeof(off), &off) == 0;
#else
    (void)cpu;
    (void)saved;
    return 0;
#endif
}

/* Wait for a job newer than `seen` (returns with P.mu held): spin, then poll with sched_yield, then sleep.
 * Returns 1 when the job was found without sleeping; *steered says the affinity in *saved must be restored. */
static int wait_job(unsigned long seen, int declined, int caller_cpu, int *steered, nb_mask *saved)
{
    const long long t0 = now_ns();
    const long long spin = declined ? 0 : (long long)P.spin_us * 1000;
    const long long yield = declined ? 0 : (long long)P.yield_us * 1000;
    int polls = 0;
    *steered = 0;
    while (atomic_load_explicit(&P.gen, memory_order_acquire) == seen && !P.stop) {
        CPU_RELAX();
        if (++polls == 64) {
            polls = 0;
            const long long dt = now_ns() - t0;
            if (dt > spin + yield) goto sleep;
            if (dt > spin) sched_yield();
        }
    }
    pthread_mutex_lock(&P.mu);
    return 1;
sleep:
    *steered = P.steer && steer_off(caller_cpu, saved);
    pthread_mutex_lock(&P.mu);
    P.sleepers++;
    while (atomic_load(&P.gen) == seen && !P.stop) pthread_cond_wait(&P.cv_work, &P.mu);
    P.sleepers--;
    return 0;
}

static void *worker(void *arg)
{
    /* the generation when the pool started it: a job published before this thread first runs is still new */
    unsigned long seen = (unsigned long)(uintptr_t)arg;
    int declined = 0, caller_cpu = -1, steered;
#ifdef __linux__
    pthread_setname_np(pthread_self(), POOL_THREAD_NAME); /* benchmarks find the workers by it (/proc/.../comm) */
#endif
    nb_mask saved;
    for (;;) {
        const int spun = wait_job(seen, declined, caller_cpu, &steered, &saved);
        if (P.stop) {
            pthread_mutex_unlock(&P.mu);
            if (steered) restore_mask(&saved);
            return NULL;
        }
        seen = atomic_load(&P.gen);
        atomic_fetch_add_explicit(&P.d_wakes, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&P.d_wake_ns, now_ns() - P.pub_ns, memory_order_relaxed);
        if (spun) atomic_fetch_add_explicit(&P.d_spun, 1, memory_order_relaxed);
        nb_task_fn fn = P.fn;
        void *ctx = P.ctx;
        int ntasks = P.ntasks;
        P.inflight++;
        caller_cpu = P.caller_cpu;
        pthread_mutex_unlock(&P.mu);
        declined = sched_getcpu() == caller_cpu;
        if (declined) {
            atomic_fetch_add_explicit(&P.stalls, 1, memory_order_relaxed);
            if (leave_cpu(caller_cpu)) { /* now on another CPU: take what is left of this job */
                declined = 0;
                atomic_fetch_add_explicit(&P.d_moved, 1, memory_order_relaxed);
            }
        }
        if (!declined) {
            atomic_fetch_add_explicit(&P.joined, 1, memory_order_relaxed);
            const int got = run_tasks(fn, ctx, ntasks);
            atomic_fetch_add_explicit(&P.wtasks, got, memory_order_relaxed);
            if (!got) atomic_fetch_add_explicit(&P.d_late, 1, memory_order_relaxed);
        }
        if (steered) restore_mask(&saved); /* after the job: off its critical path */
        const int probing = P.probing, mask = probing ? mask_count() : 0;
        pthread_mutex_lock(&P.mu);
        if (probing) P.probe_mask = mask;
        if (--P.inflight == 0) pthread_cond_broadcast(&P.cv_done);
        pthread_mutex_unlock(&P.mu);
    }
}

static void stop_workers(void)
{
    pthread_mutex_lock(&P.mu);
    P.stop = 1;
    pthread_cond_broadcast(&P.cv_work);
    pthread_mutex_unlock(&P.mu);
    for (int i = 0; i < P.nworkers; i++) pthread_join(P.tids[i], NULL);
    free(P.tids);
    P.tids = NULL;
    P.nworkers = 0;
    P.stop = 0;
}

static void start_workers(void)
{
    const int want = P.nthreads - 1;
    if (want <= 0) return;
    P.tids = (pthread_t *)calloc((size_t)want, sizeof(pthread_t));
    if (!P.tids) return;
    for (int i = 0; i < want; i++) {
        if (pthread_create(&P.tids[i], NULL, worker, (void *)(uintptr_t)atomic_load(&P.gen)) != 0) break;
        P.nworkers++;
    }
}

/* NOTE (back-off): a worker that joins on a CPU another process keeps busy gets a share of it and may be
 * preempted while it holds a task; the caller then waits for it, and the job takes longer than on one
 * thread (measured at load 6-8 on 2 CPUs: an M=128 int8 MatMulNBits took 3970 us on 2 threads against
 * 2040 us on one). So the caller judges each job of at least JUDGE_NS by its tail: the time it waited
 * for the workers after its own last task. A tail of more than TAIL_NS, 10 % of the caller's own work
 * and two of the caller's tasks (a worker's last task may end one task after the caller's: that is
 * granularity, not a straggler) is a miss; then jobs run on the caller alone for BACKOFF_NS << streak
 * (0.5, 1, 2, ... 64 ms; at least 1, 2, 4, then 8 times the caller's own part of that job, not counting the
 * tail, see the NOTE on the floor), and the next pooled job probes again. (Counting the tail made one preempted worker cost a long solo stretch: a
 * worker descheduled for a whole 4 ms tick in a 190 us M=1 job, measured in an autogroup of nice -19, ran
 * the next ~33 ms, some 170 jobs, on one thread: level-0 M=1 1024x1024 on 2 threads 186 us, as on one;
 * with the caller's part, 102-124 us.) A job without such a tail ends the
 * back-off, and a miss more than 128 ms after the previous one starts the streak again at 0.5 ms
 * (another process's load comes and goes). A worker that wakes too late to take a task costs the caller
 * nothing but the wake-up, so it is no miss: judging by the job's length instead made every probe after
 * a back-off fail (the worker had gone to sleep meanwhile) and kept a free second core unused. A quiet
 * machine keeps every thread; a busy one loses at most one probe job per back-off, and idle workers
 * sleep meanwhile (no spinning). */
/* NOTE (resizes): a resize that cannot keep the workers (see the NOTE on keeping them) stops them and the next
 * job starts new ones, which reach it only after
 * their thread start-up, so that job is not judged (its tail says nothing about the load), and the back-off
 * left from the old thread count is dropped. benchmarks/kernels_nbits resizes the pool before each batch of
 * 4 timed calls after one warm-up call: in a session of its own (autogroup nice -19, 1024x3072, load 3-6),
 * ours on 2 threads vs 1 at M=16 was 1.19x (level 0) and 1.45x (level 4) after one warm-up call (1.99x and
 * 2.01x after three), 1.97x and 1.88x after one with this rule; at M=1 (jobs of ~0.2 ms) one warm-up call
 * was still not enough (1.03x, level 4; 1.37-1.58x after three). */
/* NOTE (the floor of a long job's back-off): it was 8 times the caller's part of the job from the first miss.
 * On a machine where other processes take a CPU now and then (other sessions' builds, tests and profilers
 * beside this one), one preempted worker then cost some 8 jobs on one thread: the medium tiny-llm's prefill
 * of 128 tokens ran 24-35 of its ~130 pooled jobs on the caller alone. The floor now doubles with the streak
 * (1, 2, 4, then 8 times, as before once misses repeat; a job without a straggler still ends the streak): the
 * same model, the two floors alternated in one process (a temporary setter), 10 rounds of 3 runs each,
 * autogroup nice -19, load ~3.5: median 218 -> 192 ms and 224 -> 199 ms (jobs on the caller alone per run
 * 24 -> 5.6 and 35 -> 7.2); in the caller's own autogroup (nice 0, load ~3, so both CPUs shared with
 * other sessions) 296 -> 293 ms (64 -> 18). Jobs under 62 us keep their BACKOFF_NS floor. */
#define JUDGE_NS 30000LL
#define TAIL_NS 20000LL
#define BACKOFF_NS 500000LL
#define MAX_STREAK 8

static void judge(long long t0, long long t1, long long t2, int mine, int ntasks)
{
    (void)ntasks;
    const long long work = t1 - t0, wait = t2 - t1;
    if (work + wait < JUDGE_NS) return;
    /* a worker's last task may end up to one task after the caller's: only a longer tail is a straggler */
    const long long task = mine > 0 ? work / mine : work;
    if (wait < TAIL_NS || wait * 10 <= work || wait <= 2 * task) { /* no straggler */
        P.streak = 0;
        return;
    }
    if (t0 - P.last_bad > (BACKOFF_NS << MAX_STREAK)) P.streak = 0; /* the last miss is old: load changes */
    if (P.streak < MAX_STREAK) P.streak++;
    P.last_bad = t2;
    long long d = BACKOFF_NS << (P.streak - 1);
    /* long jobs: at least 1, 2, 4, then 8 times the caller's part of this one (see the NOTE on the floor) */
    const long long floor = work << (P.streak - 1 < 3 ? P.streak - 1 : 3);
    if (d < floor) d = floor;
    P.solo_until = t2 + d;
}

void nb_pool_run(nb_task_fn fn, void *ctx, int ntasks)
{
    int expected = 0;
    if (ntasks <= 1 || !atomic_compare_exchange_strong(&P.busy, &expected, 1)) {
        for (int t = 0; t < ntasks; t++) fn(ctx, t);
        return;
    }
    if (P.nthreads == 0) P.nthreads = nb_pool_default_threads();
    int fresh = 0; /* this job starts the workers (see the NOTE on resizes) */
    if (P.nworkers == 0 && P.nthreads > 1) {
        start_workers();
        fresh = 1;
        P.streak = 0;
        P.solo_until = 0;
    }
    /* one thread: workers kept from a larger count sleep (see the NOTE on keeping the workers) */
    if (P.nthreads == 1 || P.nworkers == 0) {
        for (int t = 0; t < ntasks; t++) fn(ctx, t);
        atomic_store(&P.busy, 0);
        return;
    }
    const long long t0 = now_ns();
    if (t0 < P.solo_until) {
        for (int t = 0; t < ntasks; t++) fn(ctx, t);
        atomic_fetch_add_explicit(&P.solo, 1, memory_order_relaxed);
        atomic_store(&P.busy, 0);
        return;
    }
    pthread_mutex_lock(&P.mu);
    while (P.inflight > 0) { /* a late worker of the previous job is still leaving */
        P.caller_waits = 1;
        pthread_cond_wait(&P.cv_done, &P.mu);
    }
    P.caller_waits = 0;
    P.fn = fn;
    P.ctx = ctx;
    P.ntasks = ntasks;
    atomic_store(&P.next, 0);
    atomic_store(&P.done, 0);
    P.caller_cpu = sched_getcpu();
    P.pub_ns = t0;
    atomic_fetch_add_explicit(&P.jobs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&P.ttasks, ntasks, memory_order_relaxed);
    pthread_mutex_unlock(&P.mu);
    atomic_fetch_add(&P.gen, 1);
    if (atomic_load(&P.sleepers) > 0) {
        pthread_mutex_lock(&P.mu);
        pthread_cond_broadcast(&P.cv_work);
        pthread_mutex_unlock(&P.mu);
    }

    const int mine = run_tasks(fn, ctx, ntasks);

    const long long t1 = now_ns(), spin = (long long)P.spin_us * 1000;
    int polls = 0;
    while (atomic_load_explicit(&P.done, memory_order_acquire) < ntasks) {
        CPU_RELAX();
        if (++polls == 64) {
            polls = 0;
            if (now_ns() - t1 > spin) break;
        }
    }
    if (atomic_load(&P.done) < ntasks) {
        pthread_mutex_lock(&P.mu);
        atomic_store(&P.caller_waits, 1);
        while (atomic_load(&P.done) < ntasks) pthread_cond_wait(&P.cv_done, &P.mu);
        atomic_store(&P.caller_waits, 0);
        pthread_mutex_unlock(&P.mu);
    }
    if (!fresh) judge(t0, t1, now_ns(), mine, ntasks);
    atomic_store(&P.busy, 0);
}

long long nb_pool_stalls(void)
{
    return atomic_load(&P.stalls);
}

void nb_pool_stats(long long out[6])
{
    out[5] = atomic_load(&P.solo);
    out[0] = atomic_load(&P.jobs);
    out[1] = atomic_load(&P.stalls);
    out[2] = atomic_load(&P.joined);
    out[3] = atomic_load(&P.wtasks);
    out[4] = atomic_load(&P.ttasks);
}

void nb_pool_diag(long long out[5])
{
    out[0] = atomic_load(&P.d_wakes);
    out[1] = atomic_load(&P.d_wake_ns);
    out[2] = atomic_load(&P.d_spun);
    out[3] = atomic_load(&P.d_moved);
    out[4] = atomic_load(&P.d_late);
}

typedef struct {
    atomic_int started, worker_mask;
    long long deadline;
    pthread_t caller;
} probe_ctx;

/* each task waits at a gate until both have started (or the deadline): two threads at once, or none */
static void probe_task(void *ctx, int t)
{
    (void)t;
    probe_ctx *p = (probe_ctx *)ctx;
    if (!pthread_equal(pthread_self(), p->caller)) atomic_store(&p->worker_mask, mask_count());
    atomic_fetch_add(&p->started, 1);
    while (atomic_load(&p->started) < 2 && now_ns() < p->deadline) CPU_RELAX();
}

void nb_pool_probe(long long timeout_ns, int asleep, int out[3])
{
    probe_ctx p = {.deadline = now_ns() + timeout_ns, .caller = pthread_self()};
    for (int n = 0; asleep && now_ns() < p.deadline; sched_yield()) { /* gate: every worker sleeps */
        pthread_mutex_lock(&P.mu);
        n = P.sleepers;
        pthread_mutex_unlock(&P.mu);
        if (n >= P.nworkers) break;
    }
    P.probing = 1;
    P.probe_mask = 0;
    P.solo_until = 0; /* a back-off left by earlier calls would run the probe on the caller alone */
    nb_pool_run(probe_task, &p, 2);
    pthread_mutex_lock(&P.mu);
    while (P.inflight > 0) { /* the worker's steps after the job (its mask restored) */
        P.caller_waits = 1;
        pthread_cond_wait(&P.cv_done, &P.mu);
    }
    P.caller_waits = 0;
    P.probing = 0;
    out[0] = atomic_load(&p.worker_mask) > 0;
    out[1] = atomic_load(&p.worker_mask);
    out[2] = P.probe_mask;
    pthread_mutex_unlock(&P.mu);
}

static void acquire_idle_pool(void)
{
    int expected = 0;
    while (!atomic_compare_exchange_weak(&P.busy, &expected, 1)) {
        expected = 0;
        sched_yield();
    }
}

/* NOTE (keeping the workers): a resize to one thread keeps the started workers asleep (calls then run on the
 * caller without publishing a job, so nothing wakes them), and a resize back to as many threads as there are
 * workers plus the caller uses them again; any other change restarts them. A new worker can wait milliseconds
 * for its first run: measured on the 2-vCPU Zen 4 at load ~3 (/proc schedstat of the new thread, state R,
 * after each restart), 0 us of CPU through six 45 us calls in one batch, 4.7 ms of queue wait before its
 * first run in another, while a kept worker joined the next call. Restarts happen whenever a process
 * alternates thread counts: the cold path (fewer threads while preparation runs), sessions of different
 * intra_op_num_threads, the benchmarks' 1-thread batches. */
void nb_pool_set_threads(int n)
{
    if (n < 1) n = 1;
    acquire_idle_pool();
    if (n != P.nthreads) {
        if (n > 1 && n - 1 != P.nworkers) stop_workers(); /* kept for 1 thread or their own count */
        P.nthreads = n;
        P.streak = 0; /* the back-off judged another thread count */
        P.solo_until = 0;
    }
    atomic_store(&P.busy, 0);
}

int nb_pool_get_threads(void)
{
    return P.nthreads ? P.nthreads : nb_pool_default_threads();
}

void nb_pool_set_spin_us(int us)
{
    P.spin_us = us < 0 ? 0 : us;
}

void nb_pool_get_wait(int out[3])
{
    out[0] = P.spin_us;
    out[1] = P.yield_us;
    out[2] = P.steer;
}

void nb_pool_set_wait(int spin_us, int yield_us, int steer)
{
    P.spin_us = spin_us < 0 ? 0 : spin_us;
    P.yield_us = yield_us < 0 ? 0 : yield_us;
    P.steer = steer != 0;
}

/* a forked child has no workers: forget the parent's and start fresh on the next call */
static void after_fork_child(void)
{
    pthread_mutex_init(&P.mu, NULL);
    pthread_cond_init(&P.cv_work, NULL);
    pthread_cond_init(&P.cv_done, NULL);
    P.tids = NULL;
    P.nworkers = 0;
    P.inflight = 0;
    P.caller_waits = 0;
    P.stop = 0;
    atomic_store(&P.busy, 0);
}

__attribute__((constructor)) static void register_fork_handler(void)
{
    pthread_atfork(NULL, NULL, after_fork_child);
}

static __thread float *t_scratch;
static __thread size_t t_scratch_n;

float *nb_scratch(size_t n)
{
    if (n > t_scratch_n) {
        const size_t want = n < 4096 ? 4096 : n;
        float *p = (float *)malloc(want * sizeof(float));
        if (!p) return NULL;
        free(t_scratch);
        t_scratch = p;
        t_scratch_n = want;
    }
    return t_scratch;
}

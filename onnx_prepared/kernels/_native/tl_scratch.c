/* Per-thread scratch freed at thread exit: see tl_scratch.h. */
#include "tl_scratch.h"

#include <pthread.h>
#include <stdatomic.h>

enum { TL_FNS = 8 };

static pthread_key_t tl_key;
static pthread_once_t tl_once = PTHREAD_ONCE_INIT;
static int tl_key_ok;
static _Thread_local tl_free_fn *tl_fns[TL_FNS];
static _Thread_local int tl_nfns;
static atomic_llong tl_held;

/* The key's destructor: the exiting thread's _Thread_local variables are still there. */
static void tl_run(void *unused)
{
    (void)unused;
    for (int i = 0; i < tl_nfns; i++) tl_fns[i]();
    tl_nfns = 0;
}

static void tl_make_key(void) { tl_key_ok = pthread_key_create(&tl_key, tl_run) == 0; }

void tl_at_exit(tl_free_fn *fn)
{
    for (int i = 0; i < tl_nfns; i++)
        if (tl_fns[i] == fn) return;
    pthread_once(&tl_once, tl_make_key);
    if (!tl_key_ok || tl_nfns == TL_FNS) return; /* kept until the process ends, as before the hook */
    tl_fns[tl_nfns++] = fn;
    pthread_setspecific(tl_key, (void *)1); /* a non-NULL value: the destructor runs at exit */
}

void tl_bytes(long long delta) { atomic_fetch_add(&tl_held, delta); }

PyObject *py_thread_scratch_bytes(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromLongLong(atomic_load(&tl_held));
}

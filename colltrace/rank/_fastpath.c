/* The compiled hot path of colltrace's wrappers (optional; colltrace/rank/fastpath.py).
 *
 * A Plan is one wrapped torch.distributed collective. Called with the user's arguments, it does
 * what the Python wrapper in shim.py does for the common case (a collective on one CPU tensor,
 * blocking, every definition it needs already interned): reads the group's backend counter,
 * looks up the interned signature, thread and call stack, writes the ENTER slot into the rank's
 * ring, calls the original, reads the counter again and writes the RETURN slot. Anything else
 * (a first call, a list of tensors, async work, a CUDA tensor, digests, any error) goes to the
 * Python wrapper, which stays the reference: both write the same slots. Needs Python >= 3.10
 * (3.10 through the stand-in for PyFrame_GetLasti below) and a little-endian machine (the ring's
 * byte order).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#if PY_VERSION_HEX < 0x030A0000
#error "colltrace's fast path needs Python >= 3.10"
#elif PY_VERSION_HEX < 0x030B0000
/* Python 3.10 has no PyFrame_GetLasti; its frame's f_lasti counts code units where the function
 * (and frame.f_lasti, which the Python wrappers key stacks by) counts bytes. */
static inline int PyFrame_GetLasti(PyFrameObject *f) { return f->f_lasti < 0 ? -1 : f->f_lasti * (int)sizeof(_Py_CODEUNIT); }
#endif
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "colltrace's ring is little-endian"
#endif

#define HEADER_SIZE 4096
#define KIND_ENTER 1
#define KIND_RETURN 2
#define KIND_COMPLETE 3
#define KIND_UNTRACED 4
#define F_ASYNC 1
#define F_DONE 4

#pragma pack(push, 1)
typedef struct {          /* "<BBHIIIIIqqdQQ" (colltrace/tracefile/ringfile.py) */
    uint8_t kind, flags;
    uint16_t pad;
    uint32_t group, sig, stack, thread, aux32;
    int64_t seq, aux;
    double t;
    uint64_t rec, commit;
} Slot;
#pragma pack(pop)

/* >0 while a traced call runs on this thread: the collectives it makes inside are its parts, not
 * recorded. A C thread-local, not a threading.local: this path reads and writes it twice per call;
 * the Python wrappers and c10d's hooks reach it as recorder.local.depth (the Local type below). */
static __thread long tl_depth;

/* tl_depth for colltrace's C++ hooks (_hooks.cpp, built by `colltrace build-hooks`), which test it
 * before taking the GIL; exported as the capsule _fastpath._depth. */
static long depth_now(void)
{
    return tl_depth;
}

/* What this file reads of colltrace's own Python objects, by name: declared here once, interned
 * from this list, and exported as _fastpath.READS ({owner: names}), which
 * tests/unit/test_fastpath_reads.py holds against real instances (a renamed field fails there,
 * not as a silent fallback to the Python wrappers in every rank). */
#define COLLTRACE_READS(X) \
    X(s_recorder, "shim", "recorder") \
    X(s_disabled, "Recorder", "disabled") \
    X(s_local, "Recorder", "local") \
    X(s_rec_ids, "Recorder", "_rec_ids") \
    X(s_threads, "Recorder", "_threads") \
    X(s_thread_id, "Recorder", "thread_id") \
    X(s_stacks, "Recorder", "_stacks") \
    X(s_stack_id, "Recorder", "stack_id") \
    X(s_ring, "Recorder", "ring") \
    X(s_stack_depth, "Recorder", "_depth") \
    X(s_fail, "Recorder", "fail") \
    X(s_internal_error, "Recorder", "internal_error") \
    X(s_pending, "Recorder", "_pending") \
    X(s_mm, "RingWriter", "_mm") \
    X(s_serial, "RingWriter", "_serial") \
    X(s_slots, "RingWriter", "slots") \
    X(s_last_after, "GroupState", "last_after") \
    X(s_p2p_offset, "GroupState", "p2p_offset")

/* What learn() says of a kind of call, for a Plan and a Gate alike: one tuple of LEARNED_SIZE in
 * this order, built by fastpath.learned() (colltrace/rank/fastpath.py), whose LEARNED names the
 * fields as LEARNED_FIELDS does here (tests/unit/test_fastpath_reads.py holds them equal). */
#define L_SIG 0            /* the signature's id */
#define L_WRAPPER_ONLY 1   /* such calls are the Python wrapper's alone (a CUDA tensor, a digest to take) */
#define L_GS 2             /* the group's GroupState */
#define L_SEQ_FN 3         /* its counter getter, fn(pg) */
#define L_PG 4             /* the group, held weakly */
#define L_GID 5            /* its id */
#define L_ONE_STEP 6       /* one backend step whatever it is given */
#define LEARNED_SIZE 7
static const char *LEARNED_FIELDS[LEARNED_SIZE] = {"sig", "wrapper_only", "gs", "seq_fn", "pg", "gid", "one_step"};

#define DECLARE_READ(var, owner, text) static PyObject *var;
COLLTRACE_READS(DECLARE_READ)

static PyObject *s_compiling_flag, *s_default_pg,
    *s_shape, *s_dtype, *s_is_cuda, *s_torch_cuda, *s_cuda_initialized, *s_default_pg_field, *s_group, *s_op, *s_async_op, *s_torch_compiler,
    *s_name, *s_input_tensors, *s_output_tensors, *s_op_id, *s_work, *s_is_completed, *s_get_future, *s_value;

/* Stacks this path has met, by a hash of (code, instruction offset) per frame: a hit needs no
 * Python object. Direct-mapped, a cache of the recorder's own table (rec._stacks), which keeps every
 * code in it alive, so a code's address is not reused while its entry stands. */
#define STACK_CACHE 64
typedef struct {
    uint64_t hash;
    uintptr_t *pairs;      /* n (code, offset) pairs, innermost first */
    Py_ssize_t n;
    long long sid;
} StackEntry;

#define TKEY_LEN 11   /* build-hooks' tensor key: dims, dtype, device type, up to 8 sizes */

/* What a compiled route (a Plan, a hook Gate) takes from the recorder once (recorder.py sets these
 * for its life), and what it remembers of it: the last thread's id and the stacks it has met. */
typedef struct {
    PyObject *rec;         /* the recorder these belong to (a strong reference) */
    PyObject *local, *stacks, *threads, *rec_ids, *serial, *mm;
    PyObject *compiler;    /* torch.compiler's globals: _is_compiling_flag (set while torch.export traces) */
    PyObject *cuda;        /* torch.cuda's globals: _initialized (no CUDA tensor exists before it is set) */
    PyObject *rdict;       /* the recorder's instance dict, where its `disabled` is read (NULL: read it as an attribute) */
    long long slots, depth;
    unsigned long m_ident;  /* the last thread and its id in the trace (0: none yet) */
    long long m_tid;
    StackEntry stack_cache[STACK_CACHE];
} Parts;
#define PARTS_OBJECTS(X) X(r.rec) X(r.local) X(r.stacks) X(r.threads) X(r.rec_ids) X(r.serial) X(r.mm) X(r.compiler) X(r.cuda) \
    X(r.rdict)

typedef struct {
    PyObject_HEAD
    PyObject *orig;        /* the torch.distributed function */
    vectorcallfunc vectorcall;   /* Plan_vectorcall: called without a tuple or dict of its arguments */
    PyObject *slow;        /* the Python wrapper: everything the fast path does not take */
    PyObject *learn;       /* learn(rec, pg, tensor, op, is_async, root, group_root) -> a learned tuple (L_*) or None */
    PyObject *shim;        /* shim's globals: "recorder" is read on every call */
    PyObject *non_member;  /* GroupMember.NON_GROUP_MEMBER */
    PyObject *sigs;        /* (id(pg), shape, dtype, op, async, root, group root, is_cuda) -> what learn said, for `rec` */
    Parts r;               /* the recorder's parts, its thread and stack caches */
    PyObject *world;       /* c10d._world: its default_pg is read on each call */
    /* the last call's signature and what it learned: a loop makes the same call again. Its tensor
     * as the Python objects the signature is keyed by, or (m_tread) as build-hooks' reader saw it */
    PyObject *m_pg, *m_shape, *m_dtype, *m_cuda, *m_op, *m_root, *m_groot, *m_known;
    int m_tread;
    long long m_tkey[TKEY_LEN];
    Py_ssize_t tensor_pos, group_pos, op_pos, async_pos, root_pos, groot_pos;   /* -1: not a parameter */
    PyObject *tensor_name, *op_default;
    PyObject *root_name, *groot_name;   /* a rooted op's src/dst and group_src/group_dst; NULL: none */
    int has_tensor, reducing, one_step;
    unsigned long long hits;   /* calls this path recorded itself (tests check it is used) */
} Plan;

/* a vectorcall's arguments: n positional, then one per keyword named in kwnames */
typedef struct {
    PyObject *const *v;
    Py_ssize_t n;
    PyObject *kwnames;
} Args;

static PyObject *arg(const Args *a, Py_ssize_t pos, PyObject *name, PyObject *dflt)
{   /* borrowed; the parameter by position, else keyword, else its default */
    if (pos >= 0 && a->n > pos)
        return a->v[pos];
    if (a->kwnames != NULL && name != NULL) {
        Py_ssize_t nk = PyTuple_GET_SIZE(a->kwnames);
        for (Py_ssize_t i = 0; i < nk; i++)   /* keywords and parameter names are interned: identity first */
            if (PyTuple_GET_ITEM(a->kwnames, i) == name)
                return a->v[a->n + i];
        for (Py_ssize_t i = 0; i < nk; i++)
            if (PyUnicode_Compare(PyTuple_GET_ITEM(a->kwnames, i), name) == 0)
                return a->v[a->n + i];
    }
    return dflt;
}

static double now(void)
{   /* time.time(): the same clock */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int as_long(PyObject *v, long long *out)
{   /* takes the reference: v is a new reference or NULL (an error already set) */
    if (v == NULL)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int long_attr(PyObject *obj, PyObject *name, long long *out)
{
    return as_long(PyObject_GetAttr(obj, name), out);
}

static int set_long_attr(PyObject *obj, PyObject *name, long long value)
{
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL)
        return -1;
    int rc = PyObject_SetAttr(obj, name, v);
    Py_DECREF(v);
    return rc;
}

/* A __slots__ attribute read and written where the instance keeps it (recorder.GroupState's
 * last_after and p2p_offset, on every call): the member's offset, learned once per type from its
 * descriptor. PyObject_GetAttr/SetAttr where the attribute is anything else (a property, a
 * subclass's __dict__ entry) or the slot is empty. */
typedef struct {
    PyTypeObject *type;   /* the type the offset was learned for (a strong reference; NULL: none yet) */
    Py_ssize_t offset;    /* > 0: a writable object member's offset; 0: the generic route */
} SlotAttr;

static SlotAttr sa_last_after, sa_p2p_offset;

/* what `tp` says `name` is (a new reference, or NULL with no error): a descriptor, for the caches
 * below, which then hold `tp` (*held) as the type they were learned for */
static PyObject *learn_type(PyTypeObject **held, PyTypeObject *tp, PyObject *name)
{
    PyObject *d = PyObject_GetAttr((PyObject *)tp, name);
    PyErr_Clear();
    Py_INCREF(tp);
    Py_XSETREF(*held, tp);
    return d;
}

static PyObject **slot_ptr(SlotAttr *sa, PyObject *obj, PyObject *name)
{   /* the member's place in `obj`, or NULL: take the generic route */
    PyTypeObject *tp = Py_TYPE(obj);
    if (tp != sa->type) {
        Py_ssize_t off = 0;
        PyObject *d = learn_type(&sa->type, tp, name);   /* a member read on its type: the descriptor */
        if (d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type)) {
            PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
            if (m->type == T_OBJECT_EX && !(m->flags & READONLY) && m->offset >= (Py_ssize_t)sizeof(PyObject)
                    && m->offset + (Py_ssize_t)sizeof(PyObject *) <= tp->tp_basicsize)
                off = m->offset;
        }
        Py_XDECREF(d);
        sa->offset = off;
    }
    return sa->offset > 0 ? (PyObject **)((char *)obj + sa->offset) : NULL;
}

/* A tensor's shape and dtype, on every call: the getter its type's descriptor holds, called
 * directly where that descriptor is a C getset (torch.Tensor's, which handles __torch_function__
 * subclasses itself) and the type has no attribute hook of its own; else PyObject_GetAttr (a
 * subclass's property). Learned once per type. */
typedef struct {
    PyTypeObject *type;   /* the type the getter was learned for (a strong reference; NULL: none yet) */
    getter get;           /* NULL: the generic route */
    void *closure;
} GetterAttr;

static GetterAttr ga_shape, ga_dtype, ga_is_cuda;

static PyObject *getter_get(GetterAttr *ga, PyObject *obj, PyObject *name)
{   /* a new reference, as PyObject_GetAttr */
    PyTypeObject *tp = Py_TYPE(obj);
    if (tp != ga->type) {
        getter get = NULL;
        void *closure = NULL;
        PyObject *d = learn_type(&ga->type, tp, name);
        if (d != NULL && tp->tp_getattro == PyObject_GenericGetAttr && Py_IS_TYPE(d, &PyGetSetDescr_Type)
                && PyType_IsSubtype(tp, PyDescr_TYPE(d))) {
            PyGetSetDef *def = ((PyGetSetDescrObject *)d)->d_getset;
            get = def->get;
            closure = def->closure;
        }
        Py_XDECREF(d);
        ga->get = get;
        ga->closure = closure;
    }
    return ga->get != NULL ? ga->get(obj, ga->closure) : PyObject_GetAttr(obj, name);
}

static PyObject *slot_get(SlotAttr *sa, PyObject *obj, PyObject *name)
{   /* a new reference, as PyObject_GetAttr */
    PyObject **at = slot_ptr(sa, obj, name);
    if (at != NULL && *at != NULL)
        return Py_NewRef(*at);
    return PyObject_GetAttr(obj, name);
}

static int slot_long(SlotAttr *sa, PyObject *obj, PyObject *name, long long *out)
{
    return as_long(slot_get(sa, obj, name), out);
}

static int slot_set_long(SlotAttr *sa, PyObject *obj, PyObject *name, long long value)
{
    PyObject **at = slot_ptr(sa, obj, name);
    if (at == NULL)
        return set_long_attr(obj, name, value);
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL)
        return -1;
    Py_XSETREF(*at, v);   /* as a member's setter does */
    return 0;
}

/* The ring's serial and the record ids, one counter each that the Python writers (next(c)) and this
 * path (c->next++) share, both under the GIL: itertools.count made a number object and freed it
 * on every take, three times per call. */
typedef struct {
    PyObject_HEAD
    long long next;
} Counter;

static PyObject *Counter_next(Counter *c)
{
    return PyLong_FromLongLong(c->next++);
}

static int Counter_init(Counter *c, PyObject *args, PyObject *kwds)
{
    long long start = 0;
    if (!PyArg_ParseTuple(args, "|L:Counter", &start))
        return -1;
    c->next = start;
    return 0;
}

static PyObject *Counter_repr(Counter *c)
{
    return PyUnicode_FromFormat("Counter(%lld)", c->next);
}

static PyTypeObject CounterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "colltrace.rank._fastpath.Counter",
    .tp_doc = "Counter(start=0): itertools.count for ints, shared with the compiled path without a number object.",
    .tp_basicsize = sizeof(Counter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Counter_init,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Counter_next,
    .tp_repr = (reprfunc)Counter_repr,
};

/* the next number of a Counter, or of any other iterator of ints (itertools.count) */
static int take(PyObject *counter, long long *out)
{
    if (Py_IS_TYPE(counter, &CounterType)) {
        *out = ((Counter *)counter)->next++;
        return 0;
    }
    PyObject *v = PyIter_Next(counter);
    if (v == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "colltrace's counter is exhausted");
    return as_long(v, out);
}

/* One slot into the ring, as RingWriter.write does: the serial from its counter, the commit
 * (serial + 1) stored last; then the header's count hint (RingWriter.heartbeat keeps the larger). */
#define COUNT_OFFSET 64
static int ring_write(Parts *p, Slot *slot)
{
    long long i;
    if (take(p->serial, &i) < 0)
        return -1;
    Py_buffer view;   /* taken and released at once: the mapping can always be closed */
    if (PyObject_GetBuffer(p->mm, &view, PyBUF_WRITABLE) < 0)
        return -1;
    Py_ssize_t off = HEADER_SIZE + (Py_ssize_t)(i % p->slots) * (Py_ssize_t)sizeof(Slot);
    int rc = -1;
    if (off + (Py_ssize_t)sizeof(Slot) <= view.len) {
        char *dst = (char *)view.buf + off;
        memcpy(dst, slot, offsetof(Slot, commit));
        __atomic_store_n((uint64_t *)(dst + offsetof(Slot, commit)), (uint64_t)i + 1, __ATOMIC_RELEASE);
        uint64_t *count = (uint64_t *)((char *)view.buf + COUNT_OFFSET);
        if (*count < (uint64_t)i + 1)
            *count = (uint64_t)i + 1;
        rc = 0;
    } else {
        PyErr_SetString(PyExc_ValueError, "ring slot out of range");
    }
    PyBuffer_Release(&view);
    return rc;
}

/* The caller's stack id: (code, instruction offset) per frame, innermost first, looked up in this
 * plan's cache; on a miss, in rec._stacks under the key recorder.stack_id makes, and where it is new,
 * rec.stack_id(frame) interns it (and writes its definition). */
#define MAX_DEPTH 128
static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
}

static void stack_cache_clear(Parts *p)
{
    for (int k = 0; k < STACK_CACHE; k++) {
        PyMem_Free(p->stack_cache[k].pairs);
        p->stack_cache[k] = (StackEntry){0, NULL, 0, 0};
    }
}

static long long stack_id(Parts *p, PyObject *rec, PyFrameObject *caller)
{
    uintptr_t pairs[2 * MAX_DEPTH];
    Py_ssize_t n = 0;
    long long depth = p->depth < MAX_DEPTH ? p->depth : MAX_DEPTH;
    uint64_t h = 0xcbf29ce484222325ULL;
    PyFrameObject *f = caller;
    Py_XINCREF(f);
    while (f != NULL && n < 2 * depth) {
        PyCodeObject *code = PyFrame_GetCode(f);
        pairs[n] = (uintptr_t)code;   /* its address only: the frame holds it */
        Py_DECREF(code);
        pairs[n + 1] = (uintptr_t)(Py_ssize_t)PyFrame_GetLasti(f);
        h = mix(mix(h, pairs[n]), pairs[n + 1]);
        n += 2;
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(f);
    StackEntry *e = &p->stack_cache[h % STACK_CACHE];
    if (e->pairs != NULL && e->hash == h && e->n == n && memcmp(e->pairs, pairs, (size_t)n * sizeof(uintptr_t)) == 0)
        return e->sid;

    PyObject *key = PyTuple_New(n);
    if (key == NULL)
        return -1;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *v = k % 2 == 0 ? PyLong_FromVoidPtr((void *)pairs[k]) : PyLong_FromSsize_t((Py_ssize_t)pairs[k]);
        if (v == NULL) {
            Py_DECREF(key);
            return -1;
        }
        PyTuple_SET_ITEM(key, k, v);
    }
    long long sid = -1;
    PyObject *hit = PyDict_GetItemWithError(p->stacks, key);
    if (hit != NULL) {
        sid = PyLong_AsLongLong(hit);
    } else if (!PyErr_Occurred()) {   /* a new stack: the recorder interns it (and writes its definition) */
        PyObject *v = PyObject_CallMethodOneArg(rec, s_stack_id, caller ? (PyObject *)caller : Py_None);
        if (v != NULL) {
            sid = PyLong_AsLongLong(v);
            Py_DECREF(v);
        }
    }
    Py_DECREF(key);
    /* cached only once interned (0: its definition could not be written) and where the key is
     * the recorder's whole key (a deeper setting than MAX_DEPTH is cut here, not there) */
    if (sid > 0 && p->depth <= MAX_DEPTH) {
        uintptr_t *copy = PyMem_Realloc(e->pairs, (size_t)(n ? n : 1) * sizeof(uintptr_t));
        if (copy != NULL) {
            memcpy(copy, pairs, (size_t)n * sizeof(uintptr_t));
            *e = (StackEntry){h, copy, n, sid};
        }
    }
    return sid;
}

static long long thread_id(Parts *p, PyObject *rec)
{
    unsigned long me = PyThread_get_thread_ident();
    if (me == p->m_ident && p->m_ident != 0)
        return p->m_tid;
    PyObject *ident = PyLong_FromUnsignedLong(me);
    if (ident == NULL)
        return -1;
    long long tid = -1;
    PyObject *hit = PyDict_GetItemWithError(p->threads, ident);
    if (hit != NULL) {
        tid = PyLong_AsLongLong(hit);
    } else if (!PyErr_Occurred()) {
        PyObject *v = PyObject_CallMethodNoArgs(rec, s_thread_id);
        if (v != NULL) {
            tid = PyLong_AsLongLong(v);
            Py_DECREF(v);
        }
    }
    Py_DECREF(ident);
    if (tid > 0) {
        p->m_ident = me;
        p->m_tid = tid;
    }
    return tid;
}

/* recorder.local where this path is built: its one attribute, depth, is this file's tl_depth */
typedef struct {
    PyObject_HEAD
} Local;

static PyObject *Local_get_depth(PyObject *self, void *closure)
{
    return PyLong_FromLong(tl_depth);
}

static int Local_set_depth(PyObject *self, PyObject *value, void *closure)
{
    long d = value == NULL ? 0 : PyLong_AsLong(value);
    if (d == -1 && PyErr_Occurred())
        return -1;
    tl_depth = d;
    return 0;
}

static PyGetSetDef Local_getset[] = {
    {"depth", Local_get_depth, Local_set_depth, ">0 while a traced call runs on this thread", NULL},
    {NULL}
};

static PyTypeObject LocalType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "colltrace.rank._fastpath.Local",
    .tp_doc = "The thread's depth in traced calls, shared by the compiled path, the Python wrappers and the hooks.",
    .tp_basicsize = sizeof(Local),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_getset = Local_getset,
};

static void memo_clear(Plan *p)
{
    Py_CLEAR(p->m_shape);
    Py_CLEAR(p->m_dtype);
    Py_CLEAR(p->m_cuda);
    p->m_tread = 0;
    Py_CLEAR(p->m_op);
    Py_CLEAR(p->m_root);
    Py_CLEAR(p->m_groot);
    Py_CLEAR(p->m_known);
    p->m_pg = NULL;
    p->r.m_ident = 0;
    p->r.m_tid = 0;
    stack_cache_clear(&p->r);
}

/* obj's __dict__ (a new reference) where an attribute `name` is read from it alone: its type defines
 * no such name (no property, slot or class default that a lookup would meet first); else NULL. */
static PyObject *instance_dict(PyObject *obj, PyObject *name)
{
    PyObject *on_type = PyObject_GetAttr((PyObject *)Py_TYPE(obj), name);
    if (on_type != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError)) {
        Py_XDECREF(on_type);
        PyErr_Clear();
        return NULL;
    }
    PyErr_Clear();
    if (Py_TYPE(obj)->tp_getattro != PyObject_GenericGetAttr)
        return NULL;   /* a __getattr__/__getattribute__ of its own */
    PyObject *d = PyObject_GenericGetDict(obj, NULL);
    if (d == NULL || !PyDict_CheckExact(d)) {
        Py_XDECREF(d);
        PyErr_Clear();
        return NULL;
    }
    return d;
}

/* The recorder's parts, taken once per recorder (a new one after a fork or a reinstall). */
static int adopt_parts(Parts *r, PyObject *rec)
{
    PyObject *local = NULL, *stacks = NULL, *threads = NULL, *rec_ids = NULL, *ring = NULL,
             *serial = NULL, *mm = NULL;
    long long slots = 0, depth = 0;
    int rc = -1;
    if ((local = PyObject_GetAttr(rec, s_local))
            && (stacks = PyObject_GetAttr(rec, s_stacks)) && (threads = PyObject_GetAttr(rec, s_threads))
            && (rec_ids = PyObject_GetAttr(rec, s_rec_ids)) && (ring = PyObject_GetAttr(rec, s_ring))
            && ring != Py_None && (serial = PyObject_GetAttr(ring, s_serial)) && (mm = PyObject_GetAttr(ring, s_mm))
            && long_attr(ring, s_slots, &slots) == 0 && long_attr(rec, s_stack_depth, &depth) == 0
            && PyDict_Check(stacks) && PyDict_Check(threads) && slots > 0 && Py_IS_TYPE(local, &LocalType)) {
        Py_XSETREF(r->local, local);
        Py_XSETREF(r->stacks, stacks);
        Py_XSETREF(r->threads, threads);
        Py_XSETREF(r->rec_ids, rec_ids);
        Py_XSETREF(r->serial, serial);
        Py_XSETREF(r->mm, mm);
        local = stacks = threads = rec_ids = serial = mm = NULL;
        r->slots = slots;
        r->depth = depth;
        r->m_ident = 0;
        r->m_tid = 0;
        stack_cache_clear(r);
        /* torch.compiler, imported by now (a recorder starts after init_process_group) */
        PyObject *compiler = PyImport_GetModule(s_torch_compiler);
        PyObject *cdict = compiler ? PyModule_GetDict(compiler) : NULL;   /* borrowed */
        Py_XINCREF(cdict);
        Py_XSETREF(r->compiler, cdict);
        Py_XDECREF(compiler);
        PyObject *cuda = PyImport_GetModule(s_torch_cuda);
        PyObject *cudict = cuda ? PyModule_GetDict(cuda) : NULL;   /* borrowed */
        Py_XINCREF(cudict);
        Py_XSETREF(r->cuda, cudict);
        Py_XDECREF(cuda);
        Py_XSETREF(r->rdict, instance_dict(rec, s_disabled));
        PyErr_Clear();
        Py_INCREF(rec);
        Py_XSETREF(r->rec, rec);
        rc = 0;
    }
    Py_XDECREF(local);
    Py_XDECREF(stacks);
    Py_XDECREF(threads);
    Py_XDECREF(rec_ids);
    Py_XDECREF(ring);
    Py_XDECREF(serial);
    Py_XDECREF(mm);
    return rc;
}

static int adopt(Plan *p, PyObject *rec)
{
    if (adopt_parts(&p->r, rec) < 0)
        return -1;
    PyDict_Clear(p->sigs);
    memo_clear(p);
    return 0;
}

static PyObject *call_orig(Plan *p, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return PyObject_Vectorcall(p->orig, args, nargsf, kwnames);
}

static PyObject *call_slow(Plan *p, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyErr_Clear();   /* whatever made the fast path step aside: the Python wrapper judges it */
    return PyObject_Vectorcall(p->slow, args, nargsf, kwnames);
}

static int truthy_attr(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* rec.disabled: 1, 0, or -1 with an error set; from the instance dict where `parts` are this recorder's */
static int rec_disabled(Parts *r, PyObject *rec)
{
    if (r->rec == rec && r->rdict != NULL) {
        PyObject *v = PyDict_GetItemWithError(r->rdict, s_disabled);   /* borrowed */
        if (v == Py_False)
            return 0;
        if (v == Py_True)
            return 1;
        PyErr_Clear();
    }
    return truthy_attr(rec, s_disabled);
}

/* `colltrace build-hooks`' reader of c10d's ProcessGroup counter (use_readers): 1 and *out set,
 * or 0 where it does not read this object (then Python is asked). NULL: none loaded. */
typedef int (*SeqReader)(PyObject *, long long *);
static SeqReader seq_reader = NULL;

/* The backend's counter: type(pg)._get_sequence_number_for_group(pg) (gs.seq_fn), the group
 * held weakly (gs.pg); read from C++ where build-hooks' reader takes this group. */
static int read_seq(PyObject *seq_fn, PyObject *pg, long long *out)
{
    if (seq_reader != NULL && seq_reader(pg, out) == 1)
        return 0;
    return as_long(PyObject_CallOneArg(seq_fn, pg), out);
}

/* build-hooks' reader of a plain torch.Tensor (use_readers): 1 and key set to its dims, dtype,
 * device type and sizes (TKEY_LEN numbers), or 0 where it does not read this object. NULL: none. */
typedef int (*TensorReader)(PyObject *, long long *);
static TensorReader tensor_reader = NULL;

/* use_readers(seq, tensor): build-hooks' readers from its module's capsules; None leaves that one to Python */
static int reader_from(PyObject *capsule, const char *name, void **out)
{
    void *fn = capsule == Py_None ? NULL : PyCapsule_GetPointer(capsule, name);
    if (fn == NULL && capsule != Py_None)
        return -1;
    *out = fn;
    return 0;
}

static PyObject *use_readers(PyObject *self, PyObject *args)
{
    PyObject *seq, *tensor;
    void *s, *t;
    if (!PyArg_ParseTuple(args, "OO:use_readers", &seq, &tensor) || reader_from(seq, "colltrace_hooks.seq_reader", &s) < 0
            || reader_from(tensor, "colltrace_hooks.tensor_reader", &t) < 0)
        return NULL;
    seq_reader = (SeqReader)s;
    tensor_reader = (TensorReader)t;
    Py_RETURN_NONE;
}

static void report(PyObject *rec)
{   /* an error inside colltrace after the slots began: rec.internal_error(exc) (said once), never raised */
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    PyErr_NormalizeException(&et, &ev, &etb);
    PyObject *r = PyObject_CallMethodOneArg(rec, s_internal_error, ev ? ev : Py_None);
    Py_XDECREF(r);
    PyErr_Clear();
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(etb);
}

/* Recorder.enter() in C, for a Plan and a Gate alike (the Python recorder's enter() writes the
 * same slots): the group's numbers read (its p2p offset, the counter after colltrace's last op on
 * it, the counter now), the frame's stack and the thread interned, a record id drawn; then the
 * UNTRACED slot for ops the backend ran unseen and the ENTER slot. Returns 0 with *seq, *before
 * and *rec_id set; -1 with nothing written (an error may be set: the caller falls back to
 * Python); -2 where a slot could not be written (reported once by the recorder: the call goes
 * on untraced). */
static int enter_slots(Parts *r, PyObject *rec, PyObject *gs, PyObject *seq_fn, PyObject *pg, long long gid,
                       long long sig, PyFrameObject *frame, int flags, long long *seq_out, long long *before_out,
                       long long *rec_id_out)
{
    long long p2p_offset, before, last = -1, tid, sid, rec_id;
    PyObject *last_obj = NULL;
    int rc = -1;
    if (slot_long(&sa_p2p_offset, gs, s_p2p_offset, &p2p_offset) < 0
            || (last_obj = slot_get(&sa_last_after, gs, s_last_after)) == NULL)
        goto out;
    if (last_obj != Py_None && (last = PyLong_AsLongLong(last_obj)) == -1 && PyErr_Occurred())
        goto out;
    if ((sid = stack_id(r, rec, frame)) < 0 || (tid = thread_id(r, rec)) < 0)
        goto out;
    if (read_seq(seq_fn, pg, &before) < 0 || take(r->rec_ids, &rec_id) < 0)
        goto out;
    long long seq = before - p2p_offset + 1;
    Slot slot;
    int ok = 1;
    if (last_obj != Py_None && before > last) {
        /* the backend ran collectives colltrace did not see (DDP's reducer, pg.allreduce, compiled code) */
        slot = (Slot){KIND_UNTRACED, 0, 0, (uint32_t)gid, 0, 0, 0, 0, last - p2p_offset + 1, before - last, now(), 0, 0};
        ok = ring_write(r, &slot) == 0;
    }
    if (ok) {
        slot = (Slot){KIND_ENTER, (uint8_t)flags, 0, (uint32_t)gid, (uint32_t)sig, (uint32_t)sid, (uint32_t)tid, 0, seq,
                      -1, now(), (uint64_t)rec_id, 0};
        ok = ring_write(r, &slot) == 0;
    }
    if (!ok) {
        report(rec);
        rc = -2;
        goto out;
    }
    *seq_out = seq;
    *before_out = before;
    *rec_id_out = rec_id;
    rc = 0;
out:
    Py_XDECREF(last_obj);
    return rc;
}

static int same_shape(PyObject *a, PyObject *b)
{   /* torch.Size is a tuple: equal by value (a new one each call) */
    if (a == b)
        return 1;
    if (a == NULL || b == NULL)
        return 0;
    int eq = PyObject_RichCompareBool(a, b, Py_EQ);
    if (eq < 0)
        PyErr_Clear();
    return eq > 0;
}

/* A tensor as the signature is keyed by: its shape, dtype and is_cuda (new references). is_cuda is
 * part of the key: a CUDA tensor's calls are the Python wrapper's (an event marks them complete),
 * and the same group may also see a CPU tensor of the same shape and dtype (gloo takes both).
 * Until torch.cuda is initialized no CUDA tensor exists: False then, without torch's getter. */
static int describe_tensor(Parts *r, PyObject *tensor, PyObject **shape, PyObject **dtype, PyObject **cuda)
{
    if ((*shape = getter_get(&ga_shape, tensor, s_shape)) == NULL || (*dtype = getter_get(&ga_dtype, tensor, s_dtype)) == NULL)
        return -1;
    PyObject *initialized = r->cuda != NULL ? PyDict_GetItemWithError(r->cuda, s_cuda_initialized) : NULL;   /* borrowed */
    if (initialized == Py_False) {
        *cuda = Py_NewRef(Py_False);
        return 0;
    }
    PyErr_Clear();
    return (*cuda = getter_get(&ga_is_cuda, tensor, s_is_cuda)) == NULL ? -1 : 0;
}

/* ---- c10d's per-group hooks (torch >= 2.14): the hook route's common case ----------------------
 *
 * Gate(hook) puts c10d's hook behind the depth test: the hooks fire inside every collective, a
 * wrapped one too, where they only return; this returns before the Python function's frame is made.
 * Gate(hook, kind, ref, shim, learn, kinds) also takes the common case of the hook itself, as a Plan
 * does a wrapper's: for the pre-hook (kind 1), an op of the group `ref` whose record follows from its
 * HookOpName, how many tensors it has (none or one in, the outputs' count where `kinds` says the
 * name needs it), the one tensor's shape and dtype and async_op: no root, no peer. What learn(rec,
 * args, input_tensors, is_async) said for such calls is kept per gate; the pre-hook then writes the
 * ENTER slot (and UNTRACED before it) and leaves the op open on the thread (tl_fast); the post-hook
 * (kind 2) writes RETURN and hands the Work to the poller. Everything else, and any surprise before
 * a slot is written, goes to the Python hook (hooks.py), which writes the same slots. */

/* The op this thread's compiled pre-hook opened, until its post-hook: hooks.py's local.open, kept
 * in C. The Python hooks see it through HookLocal.open as the tuple they make themselves. */
typedef struct {
    int active, flags, one_step;
    long long op_id, rec_id, before, seq, gid;
    PyObject *gs, *seq_fn, *ref;   /* held while active */
} FastOpen;
static __thread FastOpen tl_fast;
static __thread PyObject *tl_open;   /* local.open as the Python hooks set it (NULL: None) */
static unsigned long long hook_hits;   /* ops the compiled pre-hook recorded itself (tests check it is used) */

static void fast_close(void)
{
    if (tl_fast.active) {
        tl_fast.active = 0;
        Py_CLEAR(tl_fast.gs);
        Py_CLEAR(tl_fast.seq_fn);
        Py_CLEAR(tl_fast.ref);
    }
}

typedef struct {
    PyObject_HEAD
} HookLocal;

static PyObject *HookLocal_get_open(PyObject *self, void *closure)
{
    if (tl_fast.active)   /* (op_id, ctx), ctx as Recorder.enter returns it */
        return Py_BuildValue("(L(LOLLi))", tl_fast.op_id, tl_fast.rec_id, tl_fast.gs, tl_fast.before, tl_fast.seq,
                             tl_fast.flags);
    return Py_NewRef(tl_open != NULL ? tl_open : Py_None);
}

static int HookLocal_set_open(PyObject *self, PyObject *value, void *closure)
{
    fast_close();
    PyObject *old = tl_open;
    tl_open = (value == NULL || value == Py_None) ? NULL : Py_NewRef(value);
    Py_XDECREF(old);
    return 0;
}

static PyGetSetDef HookLocal_getset[] = {
    {"open", HookLocal_get_open, HookLocal_set_open, "the op this thread's pre-hook recorded, until its post-hook", NULL},
    {NULL}
};

static PyTypeObject HookLocalType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "colltrace.rank._fastpath.HookLocal",
    .tp_doc = "The op the thread's pre-hook opened, shared by the compiled and the Python hooks.",
    .tp_basicsize = sizeof(HookLocal),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_getset = HookLocal_getset,
};

typedef struct {
    PyObject_HEAD
    PyObject *fn;          /* the Python hook: every call the compiled case does not take */
    vectorcallfunc vectorcall;
    int kind;              /* 0: the depth test only; 1: the pre-hook's common case; 2: the post-hook's */
    PyObject *ref;         /* the group, held weakly */
    PyObject *shim;        /* shim's globals: "recorder" is read on every call */
    PyObject *learn;       /* learn(rec, args, input_tensors, is_async) -> a learned tuple (L_*), False (the
                            * Python hook's, always) or None (not now) */
    PyObject *kinds;       /* bytes, per HookOpName value: 1 taken here, 2 taken with the outputs' count, else not */
    PyObject *sigs;        /* (name, n in, n out, shape, dtype, async) -> what learn said, for r.rec */
    Parts r;
    long m_name;           /* the last call's key and what learn said (m_known) */
    Py_ssize_t m_nin, m_nout;
    int m_async;
    PyObject *m_shape, *m_dtype, *m_known;
} Gate;

#define GATE_OBJECTS(X) X(fn) X(ref) X(shim) X(learn) X(kinds) X(sigs) PARTS_OBJECTS(X) X(m_shape) X(m_dtype) X(m_known)

static void gate_memo_clear(Gate *g)
{
    Py_CLEAR(g->m_shape);
    Py_CLEAR(g->m_dtype);
    Py_CLEAR(g->m_known);
}

static int gate_adopt(Gate *g, PyObject *rec)
{
    if (adopt_parts(&g->r, rec) < 0)
        return -1;
    if (g->sigs != NULL)
        PyDict_Clear(g->sigs);
    gate_memo_clear(g);
    return 0;
}

static PyObject *gate_python(Gate *g, PyObject *a)
{
    PyErr_Clear();   /* whatever made the compiled case step aside: the Python hook judges it */
    return PyObject_CallOneArg(g->fn, a);
}

/* the compiled case's checks, both hooks: the recorder (borrowed), NULL where there is none to record
 * for (*quiet set: nothing to do) or where the Python hook must judge (*quiet 0) */
static PyObject *gate_recorder(Gate *g, int *quiet)
{
    *quiet = 0;
    PyObject *rec = PyDict_GetItemWithError(g->shim, s_recorder);
    if (rec == NULL)
        return NULL;
    if (rec == Py_None) {
        *quiet = 1;
        return NULL;
    }
    int t = rec_disabled(&g->r, rec);
    if (t != 0) {
        *quiet = t > 0;
        return NULL;
    }
    if (g->r.rec != rec && gate_adopt(g, rec) < 0)
        return NULL;
    return rec;
}

static PyObject *hook_pre(Gate *g, PyObject *a)
{
    PyObject *name = NULL, *idx = NULL, *ins = NULL, *outs = NULL, *shape = NULL, *dtype = NULL, *av = NULL,
             *opv = NULL, *skey = NULL, *held = NULL;
    int done = 0;   /* 1: recorded, or nothing to record; 0: the Python hook */
    int quiet;
    PyObject *rec = gate_recorder(g, &quiet);
    if (rec == NULL) {
        done = quiet;
        goto out;
    }
    if (tl_fast.active || tl_open != NULL)
        goto out;   /* the previous op's post-hook never came (it raised): the Python hook fails it */
    if (g->r.compiler != NULL) {   /* torch.export traces: the Python hook finds the user's frame */
        PyObject *flag = PyDict_GetItemWithError(g->r.compiler, s_compiling_flag);
        if (flag == NULL ? PyErr_Occurred() != NULL : PyObject_IsTrue(flag) != 0)
            goto out;
    }
    PyObject *pg = PyWeakref_GetObject(g->ref);   /* borrowed */
    if (pg == NULL || pg == Py_None)
        goto out;
    if ((name = PyObject_GetAttr(a, s_name)) == NULL || (idx = PyNumber_Index(name)) == NULL)
        goto out;
    long nv = PyLong_AsLong(idx);
    if (nv < 0 || nv >= PyBytes_GET_SIZE(g->kinds))
        goto out;
    int kind = ((unsigned char *)PyBytes_AS_STRING(g->kinds))[nv];
    if (kind != 1 && kind != 2)
        goto out;
    if ((ins = PyObject_GetAttr(a, s_input_tensors)) == NULL || !PyList_Check(ins) || PyList_GET_SIZE(ins) > 1)
        goto out;
    Py_ssize_t nin = PyList_GET_SIZE(ins), nout = -1;
    if (kind == 2) {
        if ((outs = PyObject_GetAttr(a, s_output_tensors)) == NULL || !PyList_Check(outs))
            goto out;
        nout = PyList_GET_SIZE(outs);
    }
    if (nin == 1) {
        PyObject *tensor = PyList_GET_ITEM(ins, 0);
        if ((shape = getter_get(&ga_shape, tensor, s_shape)) == NULL || (dtype = getter_get(&ga_dtype, tensor, s_dtype)) == NULL)
            goto out;
    }
    if ((av = PyObject_GetAttr(a, s_async_op)) == NULL)
        goto out;
    int is_async = PyObject_IsTrue(av);
    if (is_async < 0)
        goto out;
    PyObject *known;   /* borrowed */
    if (g->m_known != NULL && nv == g->m_name && nin == g->m_nin && nout == g->m_nout && is_async == g->m_async
            && dtype == g->m_dtype && same_shape(shape, g->m_shape)) {
        known = g->m_known;   /* the last call's again */
    } else {
        skey = Py_BuildValue("(lnnOOO)", nv, nin, nout, shape ? shape : Py_None, dtype ? dtype : Py_None,
                             is_async ? Py_True : Py_False);
        if (skey == NULL)
            goto out;
        known = PyDict_GetItemWithError(g->sigs, skey);
        if (known == NULL) {
            if (PyErr_Occurred())
                goto out;
            PyObject *learned = PyObject_CallFunctionObjArgs(g->learn, rec, a, ins, is_async ? Py_True : Py_False, NULL);
            if (learned == NULL)
                goto out;
            if (learned == Py_None) {   /* a group colltrace cannot describe (yet) */
                Py_DECREF(learned);
                goto out;
            }
            int bad = (learned != Py_False && (!PyTuple_Check(learned) || PyTuple_GET_SIZE(learned) != LEARNED_SIZE))
                      || PyDict_SetItem(g->sigs, skey, learned) < 0;
            Py_DECREF(learned);
            if (bad || (known = PyDict_GetItemWithError(g->sigs, skey)) == NULL)
                goto out;
        }
        g->m_name = nv;
        g->m_nin = nin;
        g->m_nout = nout;
        g->m_async = is_async;
        Py_XINCREF(shape);
        Py_XSETREF(g->m_shape, shape);
        Py_XINCREF(dtype);
        Py_XSETREF(g->m_dtype, dtype);
        Py_INCREF(known);
        Py_XSETREF(g->m_known, known);
    }
    held = Py_NewRef(known);   /* another thread may clear the cache (a new recorder) while this one runs */
    if (known == Py_False)
        goto out;   /* calls like this one are the Python hook's (a root, a peer) */
    long long sig = PyLong_AsLongLong(PyTuple_GET_ITEM(known, L_SIG));
    PyObject *gs = PyTuple_GET_ITEM(known, L_GS), *seq_fn = PyTuple_GET_ITEM(known, L_SEQ_FN);
    long long gid = PyLong_AsLongLong(PyTuple_GET_ITEM(known, L_GID));
    int one_step = PyObject_IsTrue(PyTuple_GET_ITEM(known, L_ONE_STEP));
    if ((sig == -1 || gid == -1) && PyErr_Occurred())
        goto out;
    if (one_step < 0 || (opv = PyObject_GetAttr(a, s_op_id)) == NULL)
        goto out;
    long long op_id = PyLong_AsLongLong(opv);
    if (op_id == -1 && PyErr_Occurred())
        goto out;

    done = 1;
    int flags = is_async ? F_ASYNC : 0;
    long long seq, before, rec_id;
    /* the frame that issued the collective: the Python hook's caller (none on a C++ thread) */
    int entered = enter_slots(&g->r, rec, gs, seq_fn, pg, gid, sig, PyEval_GetFrame(), flags, &seq, &before, &rec_id);
    if (entered == -1) {
        done = 0;
        goto out;
    }
    if (entered == -2)
        goto out;   /* reported once by the recorder; the collective goes on */
    hook_hits++;
    tl_fast = (FastOpen){1, flags, one_step, op_id, rec_id, before, seq, gid, Py_NewRef(gs), Py_NewRef(seq_fn),
                         Py_NewRef(g->ref)};

out:
    Py_XDECREF(name);
    Py_XDECREF(idx);
    Py_XDECREF(ins);
    Py_XDECREF(outs);
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_XDECREF(av);
    Py_XDECREF(opv);
    Py_XDECREF(skey);
    Py_XDECREF(held);
    if (!done)
        return gate_python(g, a);
    PyErr_Clear();
    Py_RETURN_NONE;
}

static PyObject *hook_post(Gate *g, PyObject *a)
{
    if (!tl_fast.active)
        return PyObject_CallOneArg(g->fn, a);   /* the Python pre-hook's op, or none */
    int quiet;
    PyObject *rec = gate_recorder(g, &quiet);
    if (rec == NULL) {
        if (!quiet)
            return gate_python(g, a);
        fast_close();   /* as the Python hook: the op is closed, nothing written */
        Py_RETURN_NONE;
    }
    FastOpen o = tl_fast;   /* taken: its references are this call's now */
    tl_fast.active = 0;
    tl_fast.gs = tl_fast.seq_fn = tl_fast.ref = NULL;
    PyObject *opv = NULL, *work = NULL, *pending = NULL, *item = NULL;
    long long op_id, after = o.before + 1;
    if ((opv = PyObject_GetAttr(a, s_op_id)) == NULL || ((op_id = PyLong_AsLongLong(opv)) == -1 && PyErr_Occurred()))
        goto fail;
    if (op_id != o.op_id)
        goto out;   /* not the op this thread opened */
    /* The post-hook fires when the Work is returned, not when it completes: the poller marks the
     * record complete once the Work says so. */
    if ((work = PyObject_GetAttr(a, s_work)) == NULL)
        goto fail;
    if (!o.one_step) {
        PyObject *pg = PyWeakref_GetObject(o.ref);   /* borrowed */
        if (pg == NULL)
            goto fail;
        if (pg == Py_None)
            after = -1;   /* as GroupState.get_seq says of a freed group */
        else if (read_seq(o.seq_fn, pg, &after) < 0)
            goto fail;
    }
    if (slot_set_long(&sa_last_after, o.gs, s_last_after, after) < 0)
        goto fail;
    long long steps = after - o.before;
    Slot slot = {KIND_RETURN, (uint8_t)(o.flags | (work == Py_None ? F_DONE : 0)), 0, (uint32_t)o.gid, 0, 0, 0, 0, o.seq,
                 o.seq + (steps > 1 ? steps : 1) - 1, now(), (uint64_t)o.rec_id, 0};
    if (ring_write(&g->r, &slot) < 0)
        goto fail;
    if (work != Py_None) {   /* appended under the GIL: one step, as the poller's swap is */
        if ((pending = PyObject_GetAttr(rec, s_pending)) == NULL || !PyList_Check(pending))
            goto fail;
        if ((item = PyTuple_New(4)) == NULL)
            goto fail;
        PyObject *parts[3] = {PyLong_FromLongLong(o.rec_id), PyLong_FromLongLong(o.gid), PyLong_FromLongLong(o.seq)};
        for (int k = 0; k < 3; k++)
            PyTuple_SET_ITEM(item, k, parts[k]);   /* NULL where one failed: the tuple frees what is there */
        PyTuple_SET_ITEM(item, 3, Py_NewRef(work));
        if (parts[0] == NULL || parts[1] == NULL || parts[2] == NULL || PyList_Append(pending, item) < 0)
            goto fail;
    }
    goto out;
fail:
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "colltrace: unexpected recorder state in the post-hook");
    report(rec);
out:
    Py_XDECREF(opv);
    Py_XDECREF(work);
    Py_XDECREF(pending);
    Py_XDECREF(item);
    Py_XDECREF(o.gs);
    Py_XDECREF(o.seq_fn);
    Py_XDECREF(o.ref);
    PyErr_Clear();
    Py_RETURN_NONE;
}

static PyObject *gate_call1(Gate *g, PyObject *a)
{
    if (g->kind == 1)
        return hook_pre(g, a);
    if (g->kind == 2)
        return hook_post(g, a);
    return PyObject_CallOneArg(g->fn, a);
}

static PyObject *Gate_vectorcall(Gate *g, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (tl_depth || g->fn == NULL)
        Py_RETURN_NONE;
    if (PyVectorcall_NARGS(nargsf) == 1 && kwnames == NULL)
        return gate_call1(g, args[0]);
    return PyObject_Vectorcall(g->fn, args, nargsf, kwnames);
}

static PyObject *Gate_call(Gate *g, PyObject *args, PyObject *kwargs)
{
    if (tl_depth || g->fn == NULL)
        Py_RETURN_NONE;
    if (PyTuple_GET_SIZE(args) == 1 && (kwargs == NULL || PyDict_GET_SIZE(kwargs) == 0))
        return gate_call1(g, PyTuple_GET_ITEM(args, 0));
    return PyObject_Call(g->fn, args, kwargs);
}

static int Gate_traverse(Gate *g, visitproc visit, void *arg)
{
#define GATE_VISIT(f) Py_VISIT(g->f);
    GATE_OBJECTS(GATE_VISIT)
    return 0;
}

static int Gate_clear(Gate *g)
{
#define GATE_CLEAR(f) Py_CLEAR(g->f);
    GATE_OBJECTS(GATE_CLEAR)
    stack_cache_clear(&g->r);
    return 0;
}

static void Gate_dealloc(Gate *g)
{
    PyObject_GC_UnTrack(g);
    Gate_clear(g);
    Py_TYPE(g)->tp_free((PyObject *)g);
}

static int Gate_init(Gate *g, PyObject *args, PyObject *kwds)
{
    PyObject *fn, *ref = NULL, *shim = NULL, *learn = Py_None, *kinds = NULL;
    int kind = 0;
    if (!PyArg_ParseTuple(args, "O|iOO!OO!:Gate", &fn, &kind, &ref, &PyDict_Type, &shim, &learn, &PyBytes_Type, &kinds))
        return -1;
    if (kind != 0 && (ref == NULL || !PyWeakref_CheckRef(ref) || shim == NULL || kinds == NULL
                      || (kind == 1 && !PyCallable_Check(learn)) || kind < 0 || kind > 2)) {
        PyErr_SetString(PyExc_TypeError, "Gate(hook, kind, weakref(group), shim globals, learn, kinds)");
        return -1;
    }
    PyObject *sigs = kind ? PyDict_New() : NULL;
    if (kind && sigs == NULL)
        return -1;
    Gate_clear(g);
    g->fn = Py_NewRef(fn);
    g->kind = kind;
    g->ref = Py_XNewRef(ref);
    g->shim = Py_XNewRef(shim);
    g->learn = kind ? Py_NewRef(learn) : NULL;
    g->kinds = Py_XNewRef(kinds);
    g->sigs = sigs;
    g->r.m_ident = 0;
    g->r.m_tid = 0;
    g->vectorcall = (vectorcallfunc)Gate_vectorcall;
    return 0;
}

static PyTypeObject GateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "colltrace.rank._fastpath.Gate",
    .tp_doc = "A c10d hook that returns at once while a traced call runs on the thread (and, given a kind, "
              "records the hook route's common case itself).",
    .tp_basicsize = sizeof(Gate),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Gate, vectorcall),
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Gate_init,
    .tp_dealloc = (destructor)Gate_dealloc,
    .tp_traverse = (traverseproc)Gate_traverse,
    .tp_clear = (inquiry)Gate_clear,
    .tp_call = (ternaryfunc)Gate_call,
};

/* MethodGate(orig, slow): a method (c10d's Work.wait, set on the class) that calls orig directly
 * while a traced call runs on the thread (c10d's blocking collectives wait on their own Work inside
 * the wrapper: the hot path), else slow, colltrace's Python wrapper that records where the program
 * parks. A method descriptor: obj.wait() reaches it with self first, with no bound method made. */
typedef struct {
    PyObject_HEAD
    PyObject *orig, *slow;
    vectorcallfunc vectorcall;
} MethodGate;

static PyObject *MethodGate_vectorcall(MethodGate *g, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return PyObject_Vectorcall(tl_depth ? g->orig : g->slow, args, nargsf, kwnames);
}

static PyObject *MethodGate_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static int MethodGate_init(MethodGate *g, PyObject *args, PyObject *kwds)
{
    PyObject *orig, *slow;
    if (!PyArg_ParseTuple(args, "OO:MethodGate", &orig, &slow))
        return -1;
    Py_XSETREF(g->orig, Py_NewRef(orig));
    Py_XSETREF(g->slow, Py_NewRef(slow));
    g->vectorcall = (vectorcallfunc)MethodGate_vectorcall;
    return 0;
}

static int MethodGate_traverse(MethodGate *g, visitproc visit, void *arg)
{
    Py_VISIT(g->orig);
    Py_VISIT(g->slow);
    return 0;
}

static int MethodGate_clear(MethodGate *g)
{
    Py_CLEAR(g->orig);
    Py_CLEAR(g->slow);
    return 0;
}

static void MethodGate_dealloc(MethodGate *g)
{
    PyObject_GC_UnTrack(g);
    MethodGate_clear(g);
    Py_TYPE(g)->tp_free((PyObject *)g);
}

static PyMemberDef MethodGate_members[] = {
    {"__colltrace_original__", T_OBJECT, offsetof(MethodGate, orig), READONLY, "the method it stands for"},
    {"slow", T_OBJECT, offsetof(MethodGate, slow), READONLY, "what it calls outside traced calls"},
    {NULL}
};

static PyTypeObject MethodGateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "colltrace.rank._fastpath.MethodGate",
    .tp_doc = "A method that calls the original inside traced calls, colltrace's wrapper outside them.",
    .tp_basicsize = sizeof(MethodGate),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(MethodGate, vectorcall),
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)MethodGate_init,
    .tp_dealloc = (destructor)MethodGate_dealloc,
    .tp_traverse = (traverseproc)MethodGate_traverse,
    .tp_clear = (inquiry)MethodGate_clear,
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = MethodGate_get,
    .tp_members = MethodGate_members,
};

enum route { ORIG, SLOW };

static PyObject *Plan_vectorcall(Plan *p, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    const Args a = {args, PyVectorcall_NARGS(nargsf), kwnames};
    enum route route = SLOW;
    PyObject *result = NULL;
    int called = 0;   /* the original ran under the compiled path: its result (or exception) stands */
    PyObject *pg = NULL, *shape = NULL, *dtype = NULL, *cuda = NULL, *skey = NULL, *held = NULL;
    long long tkey[TKEY_LEN];
    int tread = 0;   /* the tensor read by build-hooks' reader into tkey: no Python objects made for it */
    PyObject *rec = PyDict_GetItemWithError(p->shim, s_recorder);   /* borrowed */
    if (rec == NULL || rec == Py_None) {
        route = ORIG;
        goto out;
    }
    int t = rec_disabled(&p->r, rec);
    if (t != 0) {
        route = t < 0 ? SLOW : ORIG;
        goto out;
    }
    if (p->r.rec != rec && adopt(p, rec) < 0)
        goto out;
    if (tl_depth) {   /* a part of a traced call (an object collective's all_gather): not recorded */
        route = ORIG;
        goto out;
    }
    if (p->r.compiler != NULL) {   /* torch.export traces: the Python wrapper steps aside as it says */
        PyObject *flag = PyDict_GetItemWithError(p->r.compiler, s_compiling_flag);
        if (flag == NULL ? PyErr_Occurred() != NULL : PyObject_IsTrue(flag) != 0)
            goto out;
    }

    /* the group: a group colltrace has not described yet goes the slow way */
    PyObject *group = arg(&a, p->group_pos, p->group_pos >= 0 ? s_group : NULL, Py_None);
    if (group == NULL)
        goto out;
    if (group == Py_None) {
        /* _World.default_pg is a Python property over _default_pg: read the field, else the property */
        pg = PyObject_GetAttr(p->world, s_default_pg_field);
        if (pg == NULL) {
            PyErr_Clear();
            pg = PyObject_GetAttr(p->world, s_default_pg);
        }
        if (pg == NULL || pg == Py_None)
            goto out;
    } else if (group == p->non_member) {
        route = ORIG;
        goto out;
    } else {
        pg = group;
        Py_INCREF(pg);
    }
    PyObject *async_op = arg(&a, p->async_pos, p->async_pos >= 0 ? s_async_op : NULL, Py_False);
    if (async_op == NULL || PyObject_IsTrue(async_op) != 0)
        goto out;   /* async work: its completion is polled, the Python wrapper's job */

    /* what is passed: one tensor (or none, for a barrier); its signature as the Python wrapper interned it */
    PyObject *tensor = Py_None;
    if (p->has_tensor) {
        tensor = arg(&a, p->tensor_pos, p->tensor_name, Py_None);
        if (tensor == NULL || tensor == Py_None || PyList_Check(tensor) || PyTuple_Check(tensor))
            goto out;
        tread = tensor_reader != NULL && tensor_reader(tensor, tkey) == 1;
        if (!tread && describe_tensor(&p->r, tensor, &shape, &dtype, &cuda) < 0)
            goto out;
    }
    PyObject *op = p->reducing ? arg(&a, p->op_pos, s_op, p->op_default) : Py_None;
    if (op == NULL)
        goto out;
    /* a rooted op's root as given (a global rank, or a group rank): learn() turns it into the record's */
    PyObject *root = Py_None, *groot = Py_None;
    if (p->root_name != NULL && (root = arg(&a, p->root_pos, p->root_name, Py_None)) == NULL)
        goto out;
    if (p->groot_name != NULL && (groot = arg(&a, p->groot_pos, p->groot_name, Py_None)) == NULL)
        goto out;
    PyObject *known;   /* borrowed */
    if (p->m_known != NULL && pg == p->m_pg && op == p->m_op && root == p->m_root && groot == p->m_groot
            && (tread ? p->m_tread && memcmp(tkey, p->m_tkey, sizeof(tkey)) == 0
                      : !p->m_tread && dtype == p->m_dtype && cuda == p->m_cuda && same_shape(shape, p->m_shape))) {
        known = p->m_known;   /* the last call's again */
        goto learned;
    }
    /* not the last call's: the signature is keyed by the tensor's Python objects, however it was read */
    if (tread && describe_tensor(&p->r, tensor, &shape, &dtype, &cuda) < 0)
        goto out;
    /* the default op by identity: hashing a pybind enum calls back into Python */
    PyObject *gkey = PyLong_FromVoidPtr(pg);   /* by id: a key must not keep a destroyed group alive */
    if (gkey == NULL)
        goto out;
    skey = PyTuple_Pack(8, gkey, shape ? shape : Py_None, dtype ? dtype : Py_None, op == p->op_default ? Py_None : op,
                        Py_False, root, groot, cuda ? cuda : Py_None);
    Py_DECREF(gkey);
    if (skey == NULL)
        goto out;
    known = PyDict_GetItemWithError(p->sigs, skey);
    if (known == NULL) {
        if (PyErr_Occurred())   /* an unhashable op (premul sum): the Python wrapper names it */
            goto out;
        PyObject *learned = PyObject_CallFunctionObjArgs(p->learn, rec, pg, tensor, op, Py_False, root, groot, NULL);
        if (learned == NULL)
            goto out;
        if (learned == Py_None) {   /* a group colltrace cannot describe (yet) */
            Py_DECREF(learned);
            goto out;
        }
        int bad = !PyTuple_Check(learned) || PyTuple_GET_SIZE(learned) != LEARNED_SIZE
                  || PyDict_SetItem(p->sigs, skey, learned) < 0;
        Py_DECREF(learned);
        if (bad || (known = PyDict_GetItemWithError(p->sigs, skey)) == NULL)
            goto out;
    }
    /* remembered by identity (the group is checked against its weak reference below) */
    p->m_pg = pg;
    Py_XINCREF(shape);
    Py_XSETREF(p->m_shape, shape);
    Py_XINCREF(dtype);
    Py_XSETREF(p->m_dtype, dtype);
    Py_XINCREF(cuda);
    Py_XSETREF(p->m_cuda, cuda);
    p->m_tread = tread;
    if (tread)
        memcpy(p->m_tkey, tkey, sizeof(tkey));
    Py_INCREF(op);
    Py_XSETREF(p->m_op, op);
    Py_INCREF(root);
    Py_XSETREF(p->m_root, root);
    Py_INCREF(groot);
    Py_XSETREF(p->m_groot, groot);
    Py_INCREF(known);
    Py_XSETREF(p->m_known, known);
learned:
    /* what learn said (L_*), held for the call: another thread may clear the cache (a new recorder)
     * while this one runs */
    held = known;
    Py_INCREF(held);
    if (PyObject_IsTrue(PyTuple_GET_ITEM(known, L_WRAPPER_ONLY)) != 0)
        goto out;   /* a CUDA tensor (its completion is an event) or a digest to take */
    long long sig = PyLong_AsLongLong(PyTuple_GET_ITEM(known, L_SIG));
    PyObject *gs = PyTuple_GET_ITEM(known, L_GS);
    PyObject *seq_fn = PyTuple_GET_ITEM(known, L_SEQ_FN);
    PyObject *live = PyWeakref_GetObject(PyTuple_GET_ITEM(known, L_PG));   /* borrowed */
    if (live != pg) {   /* the group was freed and its address reused: forget it, learn the new one next call */
        PyDict_Clear(p->sigs);
        Py_CLEAR(p->m_known);
        goto out;
    }

    long long gid = PyLong_AsLongLong(PyTuple_GET_ITEM(known, L_GID)), seq, before, rec_id;
    if (gid == -1 && PyErr_Occurred())
        goto out;
    PyFrameObject *here = PyEval_GetFrame();   /* the Python wrapper's frame; its caller is the user's */
    PyFrameObject *caller = here ? PyFrame_GetBack(here) : NULL;
    int entered = enter_slots(&p->r, rec, gs, seq_fn, pg, gid, sig, caller, 0, &seq, &before, &rec_id);
    Py_XDECREF(caller);
    if (entered == -1)
        goto out;   /* nothing written yet: the Python wrapper starts over */
    if (entered == -2) {   /* a slot could not be written: reported once by the recorder, the call goes on untraced */
        route = ORIG;
        goto out;
    }

    p->hits++;
    called = 1;
    tl_depth = 1;
    result = call_orig(p, args, nargsf, kwnames);
    tl_depth = 0;
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    if (result == NULL) {   /* the collective raised: rec.fail(ctx, exc), then the same exception */
        PyErr_NormalizeException(&exc_type, &exc_value, &exc_tb);
        PyObject *ctx = Py_BuildValue("(LOLLi)", rec_id, gs, before, seq, 0);
        PyObject *r = ctx ? PyObject_CallMethodObjArgs(rec, s_fail, ctx, exc_value ? exc_value : Py_None, NULL) : NULL;
        if (r == NULL)
            report(rec);
        Py_XDECREF(r);
        Py_XDECREF(ctx);
        PyErr_Restore(exc_type, exc_value, exc_tb);
    } else {
        /* the numbers it spanned: one for the ops that are one backend op (p->one_step), else
         * the counter read again; then the RETURN slot */
        long long after = before + 1;
        if ((p->one_step || read_seq(seq_fn, pg, &after) == 0) && slot_set_long(&sa_last_after, gs, s_last_after, after) == 0) {
            long long steps = after - before;
            Slot slot = {KIND_RETURN, F_DONE, 0, (uint32_t)gid, 0, 0, 0, 0, seq, seq + (steps > 1 ? steps : 1) - 1,
                         now(), (uint64_t)rec_id, 0};
            if (ring_write(&p->r, &slot) < 0)
                report(rec);
        } else {
            report(rec);
        }
    }

out:
    Py_XDECREF(held);
    Py_XDECREF(skey);
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_XDECREF(cuda);
    Py_XDECREF(pg);
    if (called)
        return result;
    if (route == ORIG) {
        PyErr_Clear();
        return call_orig(p, args, nargsf, kwnames);
    }
    return call_slow(p, args, nargsf, kwnames);
}

/* every object a Plan holds, named once for the garbage collector's two walks */
#define PLAN_OBJECTS(X) X(orig) X(slow) X(learn) X(shim) X(non_member) X(sigs) PARTS_OBJECTS(X) X(world) X(tensor_name) X(op_default) \
    X(root_name) X(groot_name) X(m_shape) X(m_dtype) X(m_cuda) X(m_op) X(m_root) X(m_groot) X(m_known)

static int Plan_traverse(Plan *p, visitproc visit, void *arg)
{
#define VISIT_FIELD(f) Py_VISIT(p->f);
    PLAN_OBJECTS(VISIT_FIELD)
    return 0;
}

static int Plan_clear(Plan *p)
{
#define CLEAR_FIELD(f) Py_CLEAR(p->f);
    PLAN_OBJECTS(CLEAR_FIELD)
    p->m_pg = NULL;
    stack_cache_clear(&p->r);
    return 0;
}

static void Plan_dealloc(Plan *p)
{
    PyObject_GC_UnTrack(p);
    Plan_clear(p);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static int Plan_init(Plan *p, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"orig", "slow", "learn", "shim", "world", "non_member", "tensor_pos", "tensor_name",
                            "group_pos", "op_pos", "op_default", "async_pos", "has_tensor", "reducing", "one_step",
                            "root_pos", "root_name", "groot_pos", "groot_name", NULL};
    PyObject *orig, *slow, *learn, *shim, *world, *non_member, *tensor_name, *op_default, *root_name = Py_None,
             *groot_name = Py_None;
    Py_ssize_t tensor_pos, group_pos, op_pos, async_pos, root_pos = -1, groot_pos = -1;
    int has_tensor, reducing, one_step;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO!OOnOnnOnppp|nOnO", names, &orig, &slow, &learn, &PyDict_Type,
                                     &shim, &world, &non_member, &tensor_pos, &tensor_name, &group_pos, &op_pos,
                                     &op_default, &async_pos, &has_tensor, &reducing, &one_step, &root_pos, &root_name,
                                     &groot_pos, &groot_name))
        return -1;
    PyObject *sigs = PyDict_New();
    if (sigs == NULL)
        return -1;
    Py_INCREF(orig); Py_XSETREF(p->orig, orig);
    Py_INCREF(slow); Py_XSETREF(p->slow, slow);
    Py_INCREF(learn); Py_XSETREF(p->learn, learn);
    Py_INCREF(shim); Py_XSETREF(p->shim, shim);
    Py_INCREF(world); Py_XSETREF(p->world, world);
    Py_INCREF(non_member); Py_XSETREF(p->non_member, non_member);
    Py_INCREF(tensor_name); Py_XSETREF(p->tensor_name, tensor_name);
    Py_INCREF(op_default); Py_XSETREF(p->op_default, op_default);
    Py_XSETREF(p->root_name, root_name == Py_None ? NULL : Py_NewRef(root_name));
    Py_XSETREF(p->groot_name, groot_name == Py_None ? NULL : Py_NewRef(groot_name));
    Py_XSETREF(p->sigs, sigs);
    Py_CLEAR(p->r.rec);
    memo_clear(p);
    p->tensor_pos = tensor_pos;
    p->group_pos = group_pos;
    p->op_pos = op_pos;
    p->async_pos = async_pos;
    p->root_pos = root_pos;
    p->groot_pos = groot_pos;
    p->has_tensor = has_tensor;
    p->reducing = reducing;
    p->one_step = one_step;
    p->vectorcall = (vectorcallfunc)Plan_vectorcall;
    return 0;
}

static PyMemberDef Plan_members[] = {
    {"hits", T_ULONGLONG, offsetof(Plan, hits), READONLY, "calls this path recorded itself"},
    {NULL}
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "colltrace.rank._fastpath.Plan",
    .tp_doc = "One wrapped collective's compiled hot path.",
    .tp_basicsize = sizeof(Plan),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Plan, vectorcall),
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Plan_init,
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_traverse = (traverseproc)Plan_traverse,
    .tp_clear = (inquiry)Plan_clear,
    .tp_call = PyVectorcall_Call,
    .tp_members = Plan_members,
};

/* drain(pending, final, serial, mm, slots, work_type, done, failed): Recorder._drain_pending's loop.
 * Each (rec, gid, seq, waitable) whose waitable is finished gets its COMPLETE slot; the others come
 * back (none when final). A waitable of type work_type (c10d's Work) is asked is_completed() here,
 * then its future's value() (which raises its error: exception() warns of its deprecation); any other is judged by done(waitable) (a CUDA event, a list of works): true,
 * false, or a string, the reason it failed. A work that ended in an error or a timeout is not
 * complete: (item, reason) goes to `failed`, whose FAIL slots the caller writes with the reason. */
static PyObject *drain(PyObject *self, PyObject *args)
{
    PyObject *pending, *work_type, *done_fn, *failed;
    int final;
    Parts r;
    memset(&r, 0, sizeof(r));
    if (!PyArg_ParseTuple(args, "O!pOOLOOO!:drain", &PyList_Type, &pending, &final, &r.serial, &r.mm, &r.slots,
                          &work_type, &done_fn, &PyList_Type, &failed))
        return NULL;
    if (r.slots <= 0) {
        PyErr_SetString(PyExc_ValueError, "drain: no slots");
        return NULL;
    }
    PyObject *keep = PyList_New(0);
    if (keep == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(pending); k++) {
        PyObject *item = PyList_GET_ITEM(pending, k);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 4) {
            PyErr_SetString(PyExc_ValueError, "drain: a pending item is not (rec, gid, seq, waitable)");
            goto fail;
        }
        PyObject *w = PyTuple_GET_ITEM(item, 3);
        Py_INCREF(item);   /* the list is ours, but a call below may run any Python */
        int is_work = (PyObject *)Py_TYPE(w) == work_type;
        PyObject *v = is_work ? PyObject_CallMethodNoArgs(w, s_is_completed) : PyObject_CallOneArg(done_fn, w);
        PyObject *why = NULL;   /* the reason it failed: it is finished, not complete */
        int done;
        if (v != NULL && PyUnicode_Check(v)) {
            why = v;
            v = NULL;
            done = 1;
        } else {
            done = v == NULL ? -1 : PyObject_IsTrue(v);
            Py_XDECREF(v);
        }
        if (done > 0 && is_work) {   /* finished: in an error or a timeout? its future's value() raises then */
            PyObject *fut = PyObject_CallMethodNoArgs(w, s_get_future);
            PyObject *val = fut != NULL ? PyObject_CallMethodNoArgs(fut, s_value) : NULL;
            if (val == NULL && fut == NULL)
                PyErr_Clear();   /* a backend without futures: finished, as before */
            else if (val == NULL)
                done = -1;       /* it failed: the reason is the error raised, below */
            Py_XDECREF(val);
            Py_XDECREF(fut);
        }
        if (done < 0) {   /* asking it failed: it failed, with that reason */
            if (!PyErr_ExceptionMatches(PyExc_Exception)) {
                Py_DECREF(item);
                goto fail;
            }
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
            why = ev != NULL ? PyObject_Str(ev) : PyUnicode_FromString("unknown error");
            Py_XDECREF(et);
            Py_XDECREF(ev);
            Py_XDECREF(tb);
            if (why == NULL) {
                Py_DECREF(item);
                goto fail;
            }
            done = 1;
        }
        int rc = 0;
        if (why != NULL) {
            PyObject *pair = PyTuple_Pack(2, item, why);
            Py_DECREF(why);
            rc = pair == NULL ? -1 : PyList_Append(failed, pair);
            Py_XDECREF(pair);
        } else if (done) {
            long long rec = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 0)), gid = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 1)),
                      seq = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 2));
            if (PyErr_Occurred()) {
                rc = -1;
            } else {
                Slot slot = {KIND_COMPLETE, 0, 0, (uint32_t)gid, 0, 0, 0, 0, seq, 0, now(), (uint64_t)rec, 0};
                rc = ring_write(&r, &slot);
            }
        } else if (!final) {
            rc = PyList_Append(keep, item);
        }
        Py_DECREF(item);
        if (rc < 0)
            goto fail;
    }
    return keep;
fail:
    Py_DECREF(keep);
    return NULL;
}

static PyObject *hook_hits_fn(PyObject *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(hook_hits);
}

/* The exit status (colltrace/rank/exits.py): Python hands its atexit handlers no code, and a
 * `raise SystemExit(n)` or a native exit(n) is seen by no wrapper. glibc's on_exit() handlers get
 * the status exit() was given, after Python's finalization: one JSON line to the rank's
 * definitions file (a descriptor of its own, opened for appending), written by the process that
 * armed it only (a forked child inherits the handler and the descriptor). No Python runs here. */
#if defined(__GLIBC__)
#include <fcntl.h>
#include <unistd.h>
static int status_fd = -1;
static pid_t status_pid = 0;
static int status_registered = 0;

static void write_status(int status, void *unused)
{
    (void)unused;
    if (status_fd < 0 || getpid() != status_pid)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char line[128];
    int n = snprintf(line, sizeof line, "{\"k\":\"status\",\"t\":%lld.%06ld,\"code\":%d,\"pid\":%lld}\n",
                     (long long)ts.tv_sec, (long)(ts.tv_nsec / 1000), status & 0xFF, (long long)status_pid);
    if (n > 0 && n < (int)sizeof line) {
        ssize_t w = write(status_fd, line, (size_t)n);   /* a full disk: the status is lost, nothing else */
        (void)w;
    }
}
#endif

static PyObject *status_hook(PyObject *self, PyObject *args)
{
    int fd;
    if (!PyArg_ParseTuple(args, "i:status_hook", &fd))
        return NULL;
#if defined(__GLIBC__)
    if (status_fd >= 0) {
        close(status_fd);
        status_fd = -1;
    }
    if (fd < 0)
        Py_RETURN_FALSE;
    int mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (mine < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    if (!status_registered) {
        if (on_exit(write_status, NULL) != 0) {
            close(mine);
            Py_RETURN_FALSE;
        }
        status_registered = 1;
    }
    status_pid = getpid();
    status_fd = mine;
    Py_RETURN_TRUE;
#else
    (void)fd;
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef module_methods[] = {
    {"hook_hits", hook_hits_fn, METH_NOARGS, "ops the compiled pre-hook recorded itself"},
    {"drain", drain, METH_VARARGS, "Recorder._drain_pending's loop: COMPLETE slots for the finished waitables"},
    {"use_readers", use_readers, METH_VARARGS, "read group counters and plain tensors through build-hooks' readers "
                                                "(their capsules; None: Python)"},
    {"status_hook", status_hook, METH_VARARGS, "write the exit status to this descriptor as the process ends "
                                                "(glibc's on_exit; -1: no more); False where it cannot"},
    {NULL}
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastpath", "colltrace's compiled hot path.", -1,
                                    module_methods};

/* READS[owner] += (name,): the export of COLLTRACE_READS. */
static int add_read(PyObject *reads, const char *owner, PyObject *name)
{
    PyObject *have = PyDict_GetItemString(reads, owner);   /* borrowed */
    PyObject *one = PyTuple_Pack(1, name);
    if (one == NULL)
        return -1;
    PyObject *now = have ? PySequence_Concat(have, one) : Py_NewRef(one);
    Py_DECREF(one);
    if (now == NULL)
        return -1;
    int rc = PyDict_SetItemString(reads, owner, now);
    Py_DECREF(now);
    return rc;
}

#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC PyInit__fastpath(void)
{
#define INTERN_READ(var, owner, text) INTERN(var, text);
    COLLTRACE_READS(INTERN_READ)
    INTERN(s_compiling_flag, "_is_compiling_flag"); INTERN(s_torch_compiler, "torch.compiler");
    INTERN(s_default_pg, "default_pg"); INTERN(s_shape, "shape"); INTERN(s_dtype, "dtype"); INTERN(s_is_cuda, "is_cuda"); INTERN(s_torch_cuda, "torch.cuda");
    INTERN(s_cuda_initialized, "_initialized"); INTERN(s_default_pg_field, "_default_pg");
    INTERN(s_group, "group"); INTERN(s_op, "op"); INTERN(s_async_op, "async_op");
    INTERN(s_name, "name"); INTERN(s_input_tensors, "input_tensors"); INTERN(s_output_tensors, "output_tensors");
    INTERN(s_op_id, "op_id"); INTERN(s_work, "work"); INTERN(s_is_completed, "is_completed");
    INTERN(s_get_future, "get_future"); INTERN(s_value, "value");
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyTypeObject *types[] = {&PlanType, &LocalType, &GateType, &HookLocalType, &CounterType, &MethodGateType};
    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
        if (PyType_Ready(types[k]) < 0 || PyModule_AddType(m, types[k]) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    PyObject *reads = PyDict_New();
    int bad = reads == NULL;
#define EXPORT_READ(var, owner, text) if (!bad) bad = add_read(reads, owner, var) < 0;
    COLLTRACE_READS(EXPORT_READ)
    PyObject *fields = PyTuple_New(LEARNED_SIZE);
    for (int k = 0; fields != NULL && k < LEARNED_SIZE && !bad; k++) {
        PyObject *f = PyUnicode_FromString(LEARNED_FIELDS[k]);
        bad = f == NULL;
        if (f != NULL)
            PyTuple_SET_ITEM(fields, k, f);
    }
    bad = bad || fields == NULL || PyModule_AddObjectRef(m, "LEARNED", fields) < 0;
    Py_XDECREF(fields);
    if (bad || PyModule_AddObjectRef(m, "READS", reads) < 0) {
        Py_XDECREF(reads);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(reads);
    PyObject *cap = PyCapsule_New((void *)depth_now, "colltrace.rank._fastpath._depth", NULL);
    int added = cap == NULL ? -1 : PyModule_AddObjectRef(m, "_depth", cap);
    Py_XDECREF(cap);
    if (added < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

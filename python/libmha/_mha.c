/*
 * libmha._mha: the CPython binding over include/mha.h.
 *
 * Arrays come in through the buffer protocol (NumPy), DLPack (PyTorch, and
 * anything with __dlpack__/__dlpack_device__) or __array_interface__, in
 * that order, and are viewed in place: their strides go to the C views as
 * they are. Only what the C API cannot express is checked here (dtypes, a
 * contiguous last axis, CPU memory, and the sizes of arrays the C API takes
 * as bare pointers); everything else is the library's to refuse, and its
 * message (mha_last_error) becomes the exception's. The GIL is released
 * around every library call. See docs/python.md.
 */
#include "_mha.h"

/* ------------------------------------------------------------------ */
/* Exceptions                                                          */

PyObject *Error, *status_exc[MHA_ERR_BAD_ARGUMENT + 1];
PyObject *DTypeError, *DeviceError;

/* Raises cls(msg) with .status = status. */
static void raise_with(PyObject *cls, mha_status status, const char *msg)
{
    PyObject *exc = PyObject_CallFunction(cls, "s", msg);
    if (!exc)
        return;
    PyObject *st = PyLong_FromLong((long)status);
    if (st) {
        PyObject_SetAttrString(exc, "status", st);
        Py_DECREF(st);
    }
    PyErr_SetObject(cls, exc);
    Py_DECREF(exc);
}

static PyObject *status_class(mha_status st)
{
    if ((int)st > 0 && (int)st <= MHA_ERR_BAD_ARGUMENT)
        return status_exc[st];
    return Error;
}

/* The library refused a call: its own message. */
static void raise_last(mha_status st)
{
    const char *msg = mha_last_error();
    raise_with(status_class(st), st, msg && *msg ? msg : mha_status_string(st));
}

/* None for MHA_OK; else the library's error raised and NULL. */
static PyObject *none_or_raise(mha_status st)
{
    if (st == MHA_OK)
        return Py_NewRef(Py_None);
    raise_last(st);
    return NULL;
}

void raise_fmt(PyObject *cls, mha_status st, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    PyOS_vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    raise_with(cls, st, msg);
}

/* ------------------------------------------------------------------ */
/* Engine                                                              */

typedef struct {
    PyObject_HEAD
    mha_engine *engine;
} EngineObject;

static int parse_isa(PyObject *isa, mha_isa *out)
{
    if (!isa || isa == Py_None) {
        *out = MHA_ISA_AUTO;
        return 0;
    }
    if (PyLong_Check(isa)) {
        *out = (mha_isa)PyLong_AsLong(isa);
        return PyErr_Occurred() ? -1 : 0;
    }
    const char *name = PyUnicode_Check(isa) ? PyUnicode_AsUTF8(isa) : NULL;
    if (!name) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "isa must be a name such as \"avx2\"");
        return -1;
    }
    mha_status st = mha_isa_from_name(name, out);
    if (st != MHA_OK) {
        raise_last(st);
        return -1;
    }
    return 0;
}

static int Engine_init(EngineObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"num_threads", "isa", "flush_subnormals", NULL};
    int threads = 0, flush = 0;
    PyObject *isa = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|iOp:Engine", kwlist, &threads, &isa,
                                     &flush))
        return -1;
    mha_config cfg = {0};
    cfg.num_threads = threads;
    cfg.flush_subnormals = flush;
    if (parse_isa(isa, &cfg.isa) < 0)
        return -1;
    mha_engine *e = NULL;
    mha_status st = mha_engine_create(&cfg, &e);
    if (st != MHA_OK) {
        raise_last(st);
        return -1;
    }
    mha_engine_destroy(self->engine);
    self->engine = e;
    return 0;
}

static void Engine_dealloc(EngineObject *self)
{
    mha_engine_destroy(self->engine);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Engine_isa(EngineObject *self, void *c)
{
    (void)c;
    return PyUnicode_FromString(mha_isa_name(mha_engine_isa(self->engine)));
}

static PyObject *Engine_threads(EngineObject *self, void *c)
{
    (void)c;
    return PyLong_FromLong(mha_engine_num_threads(self->engine));
}

static PyObject *Engine_repr(EngineObject *self)
{
    return PyUnicode_FromFormat("libmha.Engine(num_threads=%d, isa='%s')",
                                mha_engine_num_threads(self->engine),
                                mha_isa_name(mha_engine_isa(self->engine)));
}

static PyGetSetDef Engine_getset[] = {
    {"isa", (getter)Engine_isa, NULL, "The ISA name this engine's kernels use.", NULL},
    {"num_threads", (getter)Engine_threads, NULL,
     "The most threads one call of this engine uses.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "libmha.Engine",
    .tp_basicsize = sizeof(EngineObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Engine(num_threads=0, isa='auto', flush_subnormals=False)\n\nA "
              "kernel table and a thread count (mha_engine). Immutable; any "
              "number of threads may call through one at once. num_threads=0 "
              "uses OpenMP's default; isa is a name of libmha.isas() or 'auto'; "
              "flush_subnormals=True reads subnormal inputs and results as 0 "
              "(faster on x86 when many are subnormal).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Engine_init,
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_getset = Engine_getset,
    .tp_repr = (reprfunc)Engine_repr,
};

static int get_engine(PyObject *o, const mha_engine **e)
{
    if (!PyObject_TypeCheck(o, &EngineType) || !((EngineObject *)o)->engine) {
        PyErr_SetString(PyExc_TypeError, "engine must be a libmha.Engine");
        return -1;
    }
    *e = ((EngineObject *)o)->engine;
    return 0;
}

/* ------------------------------------------------------------------ */
/* attention                                                           */

/* window (None or (left, right), -1 unbounded), softcap (0: off) and sinks
 * (float32 [H] or None) into *t; *any says whether a term is set. vs keeps
 * the sinks array alive during the call. */
static int terms_of(PyObject *window, double softcap, PyObject *sinks, int64_t heads,
                    mha_score_terms *t, view *vs, int *any)
{
    memset(t, 0, sizeof *t);
    *any = 0;
    if (window && window != Py_None) {
        long long l, r;
        if (!PyArg_ParseTuple(window, "LL", &l, &r)) {
            PyErr_Clear();
            raise_fmt(status_exc[MHA_ERR_BAD_ARGUMENT], MHA_ERR_BAD_ARGUMENT,
                      "window must be None or a tuple (left, right) of ints "
                      "(-1: unbounded)");
            return -1;
        }
        t->window = 1, t->window_left = l, t->window_right = r;
        *any = 1;
    }
    if (softcap != 0.0) {
        t->softcap = (float)softcap; /* the library checks the value */
        *any = 1;
    }
    if (sinks && sinks != Py_None) {
        int64_t h[1] = {heads};
        if (view_get(sinks, "sinks", 0, vs) < 0 || need_kind(vs, "sinks", VK_F32) < 0 ||
            need_shape(vs, "sinks", 1, h, "[H]") < 0 || need_packed(vs, "sinks") < 0)
            return -1;
        t->sinks = (const float *)vs->data;
        *any = 1;
    }
    return 0;
}

/* A [B, Lk] bool/uint8 key padding mask (nonzero = attend) into m. */
static int key_keep_of(PyObject *o, int64_t batch, int64_t lk, mha_mask *m, view *v)
{
    int64_t shape[2] = {batch, lk};
    if (view_get(o, "key_keep", 0, v) < 0)
        return -1;
    if (v->kind != VK_BOOL && v->kind != VK_U8) {
        raise_fmt(DTypeError, MHA_ERR_UNSUPPORTED,
                  "key_keep has dtype %s; libmha takes bool or uint8", v->dtype);
        return -1;
    }
    if (need_shape(v, "key_keep", 2, shape, "[B, Lk]") < 0)
        return -1;
    if (lk > 1 && v->strides[1] != 1) {
        raise_fmt(status_exc[MHA_ERR_BAD_STRIDE], MHA_ERR_BAD_STRIDE,
                  "key_keep: the key axis has a stride of %lld elements; libmha "
                  "needs it contiguous", (long long)v->strides[1]);
        return -1;
    }
    m->key_keep = (const uint8_t *)v->data;
    m->key_keep_stride_batch = batch > 1 ? v->strides[0] : 0;
    return 0;
}

/* An int32 array of the given shape whose rows are contiguous (element
 * (b, j) at b*stride + j); *stride receives the row stride. */
static int int32_rows(PyObject *o, const char *name, int nd, const int64_t *shape,
                      const char *what, view *v, int64_t *stride)
{
    if (view_get(o, name, 0, v) < 0 || need_kind(v, name, VK_I32) < 0 ||
        need_shape(v, name, nd, shape, what) < 0)
        return -1;
    if (shape[nd - 1] > 1 && v->strides[nd - 1] != 1) {
        raise_fmt(status_exc[MHA_ERR_BAD_STRIDE], MHA_ERR_BAD_STRIDE,
                  "%s: the last axis has a stride of %lld elements; libmha needs it "
                  "contiguous", name, (long long)v->strides[nd - 1]);
        return -1;
    }
    if (stride)
        *stride = nd == 2 ? v->strides[0] : 0;
    return 0;
}

/* A packed [T, H, d] array as the C API's [1, T, H, d] view. */
/* A packed [total, heads, d] view as the [1, total, heads, d] one the C
 * API takes (w). */
static int packed_view(const view *v, const char *name, view *w)
{
    if (v->ndim != 3) {
        raise_fmt(status_exc[MHA_ERR_BAD_SHAPE], MHA_ERR_BAD_SHAPE,
                  "%s has %d dimensions; expected 3 (packed [total, heads, d])", name,
                  v->ndim);
        return -1;
    }
    *w = *v;
    w->ndim = 4;
    w->shape[0] = 1, w->strides[0] = 0;
    for (int i = 0; i < 3; i++)
        w->shape[i + 1] = v->shape[i], w->strides[i + 1] = v->strides[i];
    return 0;
}

static int packed_of(const view *v, const char *name, mha_tensor *t)
{
    view w;
    return packed_view(v, name, &w) < 0 ? -1 : tensor_of(&w, name, 0, t);
}

static PyObject *py_attention(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    static char *kwlist[] = {"engine", "q", "k", "v", "out", "layout", "keep",
                             "bias", "causal", "scale", "weights", "key_lengths",
                             "out_layout", "key_keep", "window", "softcap", "sinks",
                             "lse", "kv_dtype", "k_scales", "v_scales", NULL};
    PyObject *eo, *qo, *ko, *vo, *oo, *keep = NULL, *bias = NULL, *wo = NULL,
                                         *lo = NULL, *kko = NULL, *wino = NULL,
                                         *sko = NULL, *lseo = NULL, *kso = NULL,
                                         *vso = NULL;
    const char *layout = "bhsd", *out_layout = NULL, *kv_dtype = NULL;
    int causal = 0;
    double scale = 0.0, softcap = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|$sOOidOOzOOdOOzOO:attention",
                                     kwlist, &eo, &qo, &ko, &vo, &oo, &layout, &keep,
                                     &bias, &causal, &scale, &wo, &lo, &out_layout, &kko,
                                     &wino, &softcap, &sko, &lseo, &kv_dtype, &kso, &vso))
        return NULL;
    const mha_engine *engine;
    if (get_engine(eo, &engine) < 0)
        return NULL;
    int bhsd = strcmp(layout, "bhsd") == 0;
    if (!bhsd && strcmp(layout, "bshd") != 0) {
        PyErr_SetString(PyExc_ValueError, "layout must be 'bhsd' or 'bshd'");
        return NULL;
    }
    int out_bhsd = bhsd;
    if (out_layout) {
        out_bhsd = strcmp(out_layout, "bhsd") == 0;
        if (!out_bhsd && strcmp(out_layout, "bshd") != 0) {
            PyErr_SetString(PyExc_ValueError, "out_layout must be 'bhsd' or 'bshd'");
            return NULL;
        }
    }
    view vq, vk, vv, vo_, vw, mv[3], vkk, vsk, vlse, vks, vvs;
    memset(&vw, 0, sizeof vw);
    memset(&vks, 0, sizeof vks), memset(&vvs, 0, sizeof vvs);
    memset(mv, 0, sizeof mv);
    memset(&vkk, 0, sizeof vkk), memset(&vsk, 0, sizeof vsk), memset(&vlse, 0, sizeof vlse);
    mha_score_terms terms;
    int any_terms = 0;
    memset(&vq, 0, sizeof vq), memset(&vk, 0, sizeof vk);
    memset(&vv, 0, sizeof vv), memset(&vo_, 0, sizeof vo_);
    PyObject *result = NULL;
    mha_attention_args a;
    memset(&a, 0, sizeof a);
    mha_mask mask;
    int any_mask = 0;
    if (view_get(qo, "q", 0, &vq) < 0 || tensor_of(&vq, "q", bhsd, &a.q) < 0 ||
        kv_of(ko, "k", bhsd, kv_dtype, kso, &vk, &vks, &a.k) < 0 ||
        kv_of(vo, "v", bhsd, kv_dtype, vso, &vv, &vvs, &a.v) < 0 ||
        view_get(oo, "out", 1, &vo_) < 0 || tensor_of(&vo_, "out", out_bhsd, &a.out) < 0)
        goto done;
    if (kv_dtype && mha_dtype_size(a.k.dtype) > 1 && mha_dtype_size(a.v.dtype) > 1) {
        raise_fmt(DTypeError, MHA_ERR_UNSUPPORTED,
                  "kv_dtype '%s' names 8-bit codes, but k and v have dtypes %s and %s",
                  kv_dtype, vk.dtype, vv.dtype);
        goto done;
    }
    int64_t dims[4] = {a.q.batch, a.q.heads, a.q.seq, a.k.seq};
    if (mask_of(keep, bias, lo, causal, dims, &mask, mv, &any_mask) < 0)
        goto done;
    if (kko && kko != Py_None) {
        if (key_keep_of(kko, a.q.batch, a.k.seq, &mask, &vkk) < 0)
            goto done;
        any_mask = 1;
    }
    a.mask = any_mask ? &mask : NULL;
    if (terms_of(wino, softcap, sko, a.q.heads, &terms, &vsk, &any_terms) < 0)
        goto done;
    a.terms = any_terms ? &terms : NULL;
    if (lseo && lseo != Py_None) {
        int64_t ls[3] = {a.q.batch, a.q.heads, a.q.seq};
        if (view_get(lseo, "lse", 1, &vlse) < 0 || need_kind(&vlse, "lse", VK_F32) < 0 ||
            need_shape(&vlse, "lse", 3, ls, "[B, H, Lq]") < 0 ||
            need_packed(&vlse, "lse") < 0)
            goto done;
        a.lse = (float *)vlse.data;
    }
    a.scale = (float)scale;
    if (wo && wo != Py_None) {
        if (view_get(wo, "weights", 1, &vw) < 0 || need_kind(&vw, "weights", VK_F32) < 0 ||
            need_shape(&vw, "weights", 4, dims, "[B, H, Lq, Lk]") < 0 ||
            need_packed(&vw, "weights") < 0)
            goto done;
        a.weights = (float *)vw.data;
    }
    /* q and out go to the library in their dtypes: it checks that they
     * share a compute dtype (never a silent widening copy here). */
    mha_status st;
    Py_BEGIN_ALLOW_THREADS
    st = mha_attention(engine, &a);
    Py_END_ALLOW_THREADS
    result = none_or_raise(st);
done:
    view_release(&vq), view_release(&vk), view_release(&vv), view_release(&vo_);
    view_release(&vw), view_release(&vkk), view_release(&vsk), view_release(&vlse);
    view_release(&vks), view_release(&vvs);
    for (int i = 0; i < 3; i++)
        view_release(&mv[i]);
    return result;
}

/* The codes a quantize call writes (int8 for 'i8', uint8 for the fp8
 * dtypes) as a tensor of that dtype, with the scales it computes (float32
 * over the codes' rows, broadcast as attention's k_scales). vc and vs are
 * the caller's to release. */
static int codes_out(PyObject *co, const char *name, PyObject *so, const char *kv_dtype,
                     int bhsd, view *vc, view *vs, mha_tensor *t)
{
    mha_dtype dt;
    if (view_get(co, name, 1, vc) < 0 || code_dtype_of(vc, name, kv_dtype, &dt) < 0 ||
        need_kind(vc, name, dt == MHA_I8 ? VK_I8 : VK_U8) < 0)
        return -1;
    view w = *vc;
    w.kind = VK_F32; /* the shape and strides as tensor_of reads them */
    if (tensor_of(&w, name, bhsd, t) < 0 ||
        scales_of(so, "scales", 1, bhsd, vc->ndim - 1, t, vs) < 0)
        return -1;
    t->dtype = dt;
    return 0;
}

/* mha_quantize: x (float32, [B, L, H, d] or with "bhsd" [B, H, L, d]) into
 * codes (int8 for 'i8', uint8 for the fp8 dtypes, x's shape), its scales
 * computed into scales (float32, broadcast over the rows as attention's
 * k_scales: the rows an axis of size 1 spans share one scale). */
static PyObject *py_quantize(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    static char *kwlist[] = {"x", "codes", "scales", "kv_dtype", "layout", NULL};
    PyObject *xo, *co, *so;
    const char *kv_dtype, *layout = "bshd";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOs|$s:quantize", kwlist, &xo, &co,
                                     &so, &kv_dtype, &layout))
        return NULL;
    int bhsd = strcmp(layout, "bhsd") == 0;
    if (!bhsd && strcmp(layout, "bshd") != 0) {
        PyErr_SetString(PyExc_ValueError, "layout must be 'bhsd' or 'bshd'");
        return NULL;
    }
    view vx, vc, vs;
    memset(&vx, 0, sizeof vx), memset(&vc, 0, sizeof vc), memset(&vs, 0, sizeof vs);
    PyObject *result = NULL;
    mha_tensor src, dst;
    if (view_get(xo, "x", 0, &vx) < 0 || need_kind(&vx, "x", VK_F32) < 0 ||
        tensor_of(&vx, "x", bhsd, &src) < 0 ||
        codes_out(co, "codes", so, kv_dtype, bhsd, &vc, &vs, &dst) < 0)
        goto done;
    float *scales_out = (float *)vs.data;
    mha_status st;
    Py_BEGIN_ALLOW_THREADS
    st = mha_quantize(&src, &dst, scales_out);
    Py_END_ALLOW_THREADS
    result = none_or_raise(st);
done:
    view_release(&vx), view_release(&vc), view_release(&vs);
    return result;
}

/* mha_attention_varlen: q and out packed [total_q, H, d] with cu_seqlens_q;
 * k and v packed [total_k, Hkv, d] with cu_seqlens_k, or the pool of a
 * paged cache (kv_layout "bshd": [num_blocks, block_size, Hkv, d], "bhsd":
 * [num_blocks, Hkv, block_size, d]) with block_table [B, max_blocks] and
 * seqlens [B]. */
static PyObject *py_attention_varlen(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    static char *kwlist[] = {"engine", "q", "k", "v", "out", "cu_seqlens_q",
                             "cu_seqlens_k", "block_table", "seqlens", "kv_layout",
                             "causal", "scale", "window", "softcap", "sinks",
                             "kv_dtype", "k_scales", "v_scales", NULL};
    PyObject *eo, *qo, *ko, *vo, *oo, *cqo, *cko = NULL, *bto = NULL, *slo = NULL,
                                                *wino = NULL, *sko = NULL, *kso = NULL,
                                                *vso = NULL;
    const char *kv_layout = "bshd", *kv_dtype = NULL;
    int causal = 0;
    double scale = 0.0, softcap = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOOO|$OOOsidOdOzOO:attention_varlen",
                                     kwlist, &eo, &qo, &ko, &vo, &oo, &cqo, &cko, &bto,
                                     &slo, &kv_layout, &causal, &scale, &wino, &softcap,
                                     &sko, &kv_dtype, &kso, &vso))
        return NULL;
    const mha_engine *engine;
    if (get_engine(eo, &engine) < 0)
        return NULL;
    int kv_bhsd = strcmp(kv_layout, "bhsd") == 0;
    if (!kv_bhsd && strcmp(kv_layout, "bshd") != 0) {
        PyErr_SetString(PyExc_ValueError, "kv_layout must be 'bhsd' or 'bshd'");
        return NULL;
    }
    int paged = bto && bto != Py_None;
    if (paged == (cko && cko != Py_None) || paged != (slo && slo != Py_None)) {
        raise_fmt(status_exc[MHA_ERR_BAD_ARGUMENT], MHA_ERR_BAD_ARGUMENT,
                  "give either cu_seqlens_k (packed keys) or block_table and seqlens "
                  "(a paged cache)");
        return NULL;
    }
    view vq, vk, vv, vo_, vcq, vck, vbt, vsl, vsk, vks, vvs, wk, wv;
    memset(&vks, 0, sizeof vks), memset(&vvs, 0, sizeof vvs);
    memset(&vq, 0, sizeof vq), memset(&vk, 0, sizeof vk), memset(&vv, 0, sizeof vv);
    memset(&vo_, 0, sizeof vo_), memset(&vcq, 0, sizeof vcq), memset(&vck, 0, sizeof vck);
    memset(&vbt, 0, sizeof vbt), memset(&vsl, 0, sizeof vsl), memset(&vsk, 0, sizeof vsk);
    PyObject *result = NULL;
    mha_varlen_args a;
    memset(&a, 0, sizeof a);
    mha_paged_kv pk;
    memset(&pk, 0, sizeof pk);
    mha_score_terms terms;
    int any_terms = 0;
    if (view_get(qo, "q", 0, &vq) < 0 || packed_of(&vq, "q", &a.q) < 0 ||
        view_get(oo, "out", 1, &vo_) < 0 || packed_of(&vo_, "out", &a.out) < 0 ||
        view_get(ko, "k", 0, &vk) < 0 || view_get(vo, "v", 0, &vv) < 0)
        goto done;
    /* Paged pools as they are; packed keys as [1, total, Hkv, d] (their
     * scales [total, Hkv], broadcast over the leading 1). */
    if (paged)
        wk = vk, wv = vv;
    else if (packed_view(&vk, "k", &wk) < 0 || packed_view(&vv, "v", &wv) < 0)
        goto done;
    if (kv_tensor(&wk, "k", paged && kv_bhsd, kv_dtype, kso, &vks, &a.k) < 0 ||
        kv_tensor(&wv, "v", paged && kv_bhsd, kv_dtype, vso, &vvs, &a.v) < 0)
        goto done;
    if (kv_dtype && mha_dtype_size(a.k.dtype) > 1 && mha_dtype_size(a.v.dtype) > 1) {
        raise_fmt(DTypeError, MHA_ERR_UNSUPPORTED,
                  "kv_dtype '%s' names 8-bit codes, but k and v have dtypes %s and %s",
                  kv_dtype, vk.dtype, vv.dtype);
        goto done;
    }
    if (view_get(cqo, "cu_seqlens_q", 0, &vcq) < 0 || need_kind(&vcq, "cu_seqlens_q", VK_I32) < 0)
        goto done;
    if (vcq.ndim != 1 || vcq.shape[0] < 2) {
        raise_fmt(status_exc[MHA_ERR_BAD_SHAPE], MHA_ERR_BAD_SHAPE,
                  "cu_seqlens_q must be int32 [B+1] with B >= 1");
        goto done;
    }
    a.batch = vcq.shape[0] - 1;
    int64_t b1[1] = {a.batch + 1}, bb[1] = {a.batch};
    if (need_packed(&vcq, "cu_seqlens_q") < 0)
        goto done;
    a.cu_seqlens_q = (const int32_t *)vcq.data;
    if (paged) {
        if (view_get(bto, "block_table", 0, &vbt) < 0 ||
            need_kind(&vbt, "block_table", VK_I32) < 0)
            goto done;
        if (vbt.ndim != 2 || vbt.shape[0] != a.batch) {
            raise_fmt(status_exc[MHA_ERR_BAD_SHAPE], MHA_ERR_BAD_SHAPE,
                      "block_table must be int32 [B, max_blocks] with B = %lld",
                      (long long)a.batch);
            goto done;
        }
        int64_t bts[2] = {a.batch, vbt.shape[1]};
        view_release(&vbt);
        if (int32_rows(bto, "block_table", 2, bts, "[B, max_blocks]", &vbt,
                       &pk.block_table_stride) < 0 ||
            int32_rows(slo, "seqlens", 1, bb, "[B]", &vsl, NULL) < 0)
            goto done;
        pk.block_table = (const int32_t *)vbt.data;
        pk.max_blocks = vbt.shape[1];
        if (a.batch == 1)
            pk.block_table_stride = 0;
        pk.seqlens = (const int32_t *)vsl.data;
        a.paged = &pk;
    } else {
        if (int32_rows(cko, "cu_seqlens_k", 1, b1, "[B+1]", &vck, NULL) < 0)
            goto done;
        a.cu_seqlens_k = (const int32_t *)vck.data;
    }
    a.causal = (mha_causal)causal;
    if (terms_of(wino, softcap, sko, a.q.heads, &terms, &vsk, &any_terms) < 0)
        goto done;
    a.terms = any_terms ? &terms : NULL;
    a.scale = (float)scale;
    mha_status st;
    Py_BEGIN_ALLOW_THREADS
    st = mha_attention_varlen(engine, &a);
    Py_END_ALLOW_THREADS
    result = none_or_raise(st);
done:
    view_release(&vq), view_release(&vk), view_release(&vv), view_release(&vo_);
    view_release(&vcq), view_release(&vck), view_release(&vbt), view_release(&vsl);
    view_release(&vsk), view_release(&vks), view_release(&vvs);
    return result;
}

/* mha_quantize_paged: tokens of x (float32 [n, Hkv, d], or [B, S, Hkv, d])
 * into the slots of a paged pool of codes ([num_blocks, block_size, Hkv,
 * d], or [num_blocks, Hkv, block_size, d] with "bhsd"), each written
 * slot's scales computed into scales (float32 over the pool's rows,
 * broadcast as k_scales: [num_blocks, block_size, 1] is one per token);
 * slots int64 [n] (negative: skipped). In place; nothing else changes. */
static PyObject *py_quantize_paged(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    static char *kwlist[] = {"x", "pool", "scales", "slots", "kv_dtype", "kv_layout",
                             NULL};
    PyObject *xo, *po, *so, *slo;
    const char *kv_dtype, *kv_layout = "bshd";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOs|$s:quantize_paged", kwlist, &xo,
                                     &po, &so, &slo, &kv_dtype, &kv_layout))
        return NULL;
    int bhsd = strcmp(kv_layout, "bhsd") == 0;
    if (!bhsd && strcmp(kv_layout, "bshd") != 0) {
        PyErr_SetString(PyExc_ValueError, "kv_layout must be 'bhsd' or 'bshd'");
        return NULL;
    }
    view vx, wx, vp, vs, vsl;
    memset(&vx, 0, sizeof vx), memset(&vp, 0, sizeof vp), memset(&vs, 0, sizeof vs);
    memset(&vsl, 0, sizeof vsl);
    PyObject *result = NULL;
    mha_tensor src, pool;
    if (view_get(xo, "x", 0, &vx) < 0 || need_kind(&vx, "x", VK_F32) < 0)
        goto done;
    if (vx.ndim == 3) {
        if (packed_view(&vx, "x", &wx) < 0)
            goto done;
    } else {
        wx = vx;
    }
    if (tensor_of(&wx, "x", 0, &src) < 0 ||
        codes_out(po, "pool", so, kv_dtype, bhsd, &vp, &vs, &pool) < 0 ||
        view_get(slo, "slots", 0, &vsl) < 0)
        goto done;
    int64_t n = src.batch * src.seq;
    if (need_kind(&vsl, "slots", VK_I64) < 0)
        goto done;
    if (vsl.ndim != 1 || vsl.shape[0] != n || (n > 1 && vsl.strides[0] != 1)) {
        raise_fmt(status_exc[MHA_ERR_BAD_SHAPE], MHA_ERR_BAD_SHAPE,
                  "slots must be a contiguous int64 [%lld] (one per token of x)",
                  (long long)n);
        goto done;
    }
    mha_status st;
    Py_BEGIN_ALLOW_THREADS
    st = mha_quantize_paged(&src, &pool, (const int64_t *)(const void *)vsl.data,
                            (float *)vs.data);
    Py_END_ALLOW_THREADS
    result = none_or_raise(st);
done:
    view_release(&vx), view_release(&vp), view_release(&vs), view_release(&vsl);
    return result;
}

/* ------------------------------------------------------------------ */
/* Layer                                                               */

typedef struct {
    PyObject_HEAD
    mha_layer *layer;
    PyObject *engine;
    int64_t embed_dim, num_heads, kdim, vdim;
} LayerObject;

static int Layer_init(LayerObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"engine", "embed_dim", "num_heads", "kdim", "vdim",
                             "in_proj_weight", "q_proj_weight", "k_proj_weight",
                             "v_proj_weight", "in_proj_bias", "out_proj_weight",
                             "out_proj_bias", NULL};
    PyObject *eo, *w[7] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    long long E = 0, H = 0, kd = 0, vd = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OLL|LL$OOOOOOO:Layer", kwlist, &eo, &E,
                                     &H, &kd, &vd, &w[0], &w[1], &w[2], &w[3], &w[4],
                                     &w[5], &w[6]))
        return -1;
    const mha_engine *engine;
    if (get_engine(eo, &engine) < 0)
        return -1;
    static const char *names[7] = {"in_proj_weight", "q_proj_weight", "k_proj_weight",
                                   "v_proj_weight", "in_proj_bias", "out_proj_weight",
                                   "out_proj_bias"};
    /* The C API reads these as bare arrays: their sizes are checked here
     * (when the dimensions are ones the library would accept). */
    int64_t kdim = kd ? kd : E, vdim = vd ? vd : E;
    int64_t shapes[7][2] = {{3 * E, E}, {E, E}, {E, kdim}, {E, vdim},
                            {3 * E, 0}, {E, E}, {E, 0}};
    int dims_ok = E > 0 && H > 0 && kd >= 0 && vd >= 0;
    view v[7];
    memset(v, 0, sizeof v);
    const float *p[7] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    int rc = -1;
    for (int i = 0; i < 7; i++) {
        if (!w[i] || w[i] == Py_None)
            continue;
        if (view_get(w[i], names[i], 0, &v[i]) < 0 || need_kind(&v[i], names[i], VK_F32) < 0 ||
            need_packed(&v[i], names[i]) < 0)
            goto done;
        if (dims_ok) {
            int nd = shapes[i][1] ? 2 : 1;
            char what[96];
            if (nd == 2)
                snprintf(what, sizeof what, "[%lld, %lld]", (long long)shapes[i][0],
                         (long long)shapes[i][1]);
            else
                snprintf(what, sizeof what, "[%lld]", (long long)shapes[i][0]);
            if (need_shape(&v[i], names[i], nd, shapes[i], what) < 0)
                goto done;
        }
        p[i] = (const float *)v[i].data;
    }
    mha_layer_desc d;
    memset(&d, 0, sizeof d);
    d.embed_dim = E, d.num_heads = H, d.kdim = kd, d.vdim = vd;
    d.in_proj_weight = p[0], d.q_proj_weight = p[1], d.k_proj_weight = p[2];
    d.v_proj_weight = p[3], d.in_proj_bias = p[4], d.out_proj_weight = p[5];
    d.out_proj_bias = p[6];
    mha_layer *layer = NULL;
    mha_status st;
    Py_BEGIN_ALLOW_THREADS
    st = mha_layer_create(engine, &d, &layer);
    Py_END_ALLOW_THREADS
    if (st != MHA_OK) {
        raise_last(st);
        goto done;
    }
    mha_layer_destroy(self->layer);
    self->layer = layer;
    Py_INCREF(eo);
    Py_XSETREF(self->engine, eo);
    self->embed_dim = E, self->num_heads = H, self->kdim = kdim, self->vdim = vdim;
    rc = 0;
done:
    for (int i = 0; i < 7; i++)
        view_release(&v[i]);
    return rc;
}

static void Layer_dealloc(LayerObject *self)
{
    mha_layer_destroy(self->layer); /* before its engine */
    Py_XDECREF(self->engine);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Layer_forward(LayerObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"query", "key", "value", "out", "keep", "bias",
                             "causal", "weights", "key_lengths", NULL};
    PyObject *qo, *ko, *vo, *oo, *keep = NULL, *bias = NULL, *wo = NULL, *lo = NULL;
    int causal = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|$OOiOO:forward", kwlist, &qo, &ko,
                                     &vo, &oo, &keep, &bias, &causal, &wo, &lo))
        return NULL;
    if (!self->layer) {
        PyErr_SetString(PyExc_RuntimeError, "the layer was not initialised");
        return NULL;
    }
    view vq, vk, vv, vout, vw, mv[3];
    memset(&vq, 0, sizeof vq), memset(&vk, 0, sizeof vk), memset(&vv, 0, sizeof vv);
    memset(&vout, 0, sizeof vout), memset(&vw, 0, sizeof vw), memset(mv, 0, sizeof mv);
    PyObject *result = NULL;
    mha_mask mask;
    int any = 0;
    if (view_get(qo, "query", 0, &vq) < 0 || need_kind(&vq, "query", VK_F32) < 0 ||
        need_packed(&vq, "query") < 0)
        goto done;
    if (vq.ndim != 3) {
        need_shape(&vq, "query", 3, vq.shape, "[B, Lq, E]");
        goto done;
    }
    int64_t B = vq.shape[0], Lq = vq.shape[1], E = self->embed_dim;
    int64_t qs[3] = {B, Lq, E};
    char what[96];
    snprintf(what, sizeof what, "[B, Lq, E] = [%lld, %lld, %lld]", (long long)B,
             (long long)Lq, (long long)E);
    if (need_shape(&vq, "query", 3, qs, what) < 0)
        goto done;
    if (view_get(ko, "key", 0, &vk) < 0 || need_kind(&vk, "key", VK_F32) < 0 ||
        need_packed(&vk, "key") < 0)
        goto done;
    int64_t Lk = vk.ndim == 3 ? vk.shape[1] : -1;
    int64_t ks[3] = {B, Lk, self->kdim}, vs[3] = {B, Lk, self->vdim};
    snprintf(what, sizeof what, "[B, Lk, kdim] = [%lld, Lk, %lld]", (long long)B,
             (long long)self->kdim);
    if (need_shape(&vk, "key", 3, ks, what) < 0)
        goto done;
    snprintf(what, sizeof what, "[B, Lk, vdim] = [%lld, %lld, %lld]", (long long)B,
             (long long)Lk, (long long)self->vdim);
    if (view_get(vo, "value", 0, &vv) < 0 || need_kind(&vv, "value", VK_F32) < 0 ||
        need_packed(&vv, "value") < 0 || need_shape(&vv, "value", 3, vs, what) < 0)
        goto done;
    snprintf(what, sizeof what, "[B, Lq, E] = [%lld, %lld, %lld]", (long long)B,
             (long long)Lq, (long long)E);
    if (view_get(oo, "out", 1, &vout) < 0 || need_kind(&vout, "out", VK_F32) < 0 ||
        need_packed(&vout, "out") < 0 || need_shape(&vout, "out", 3, qs, what) < 0)
        goto done;
    int64_t dims[4] = {B, self->num_heads, Lq, Lk};
    if (mask_of(keep, bias, lo, causal, dims, &mask, mv, &any) < 0)
        goto done;
    float *weights = NULL;
    if (wo && wo != Py_None) {
        if (view_get(wo, "weights", 1, &vw) < 0 || need_kind(&vw, "weights", VK_F32) < 0 ||
            need_shape(&vw, "weights", 4, dims, "[B, H, Lq, Lk]") < 0 ||
            need_packed(&vw, "weights") < 0)
            goto done;
        weights = (float *)vw.data;
    }
    mha_status st;
    Py_BEGIN_ALLOW_THREADS
    st = mha_layer_forward(self->layer, (const float *)vq.data, (const float *)vk.data,
                           (const float *)vv.data, B, Lq, Lk, any ? &mask : NULL,
                           (float *)vout.data, weights);
    Py_END_ALLOW_THREADS
    result = none_or_raise(st);
done:
    view_release(&vq), view_release(&vk), view_release(&vv), view_release(&vout);
    view_release(&vw);
    for (int i = 0; i < 3; i++)
        view_release(&mv[i]);
    return result;
}

static PyObject *Layer_get(LayerObject *self, void *which)
{
    intptr_t w = (intptr_t)which;
    return PyLong_FromLongLong(w == 0 ? self->embed_dim : w == 1 ? self->num_heads
                               : w == 2 ? self->kdim : self->vdim);
}

static PyGetSetDef Layer_getset[] = {
    {"embed_dim", (getter)Layer_get, NULL, "E", (void *)0},
    {"num_heads", (getter)Layer_get, NULL, "H", (void *)1},
    {"kdim", (getter)Layer_get, NULL, "key features", (void *)2},
    {"vdim", (getter)Layer_get, NULL, "value features", (void *)3},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef Layer_methods[] = {
    {"forward", (PyCFunction)(void (*)(void))Layer_forward, METH_VARARGS | METH_KEYWORDS,
     "forward(query, key, value, out, *, keep=None, bias=None, causal=0, "
     "weights=None, key_lengths=None)\n\nmha_layer_forward on packed float32 "
     "[B, L, features] arrays; writes out and (optionally) per-head weights "
     "[B, H, Lq, Lk]."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject LayerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "libmha._mha.Layer",
    .tp_basicsize = sizeof(LayerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Layer(engine, embed_dim, num_heads, kdim=0, vdim=0, *, weights...)"
              "\n\nmha_layer: nn.MultiheadAttention weights (copied). Use "
              "libmha.MultiheadAttention.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Layer_init,
    .tp_dealloc = (destructor)Layer_dealloc,
    .tp_methods = Layer_methods,
    .tp_getset = Layer_getset,
};

/* ------------------------------------------------------------------ */
/* Module                                                              */

static PyObject *py_version(PyObject *m, PyObject *a)
{
    (void)m, (void)a;
    return PyUnicode_FromString(mha_version());
}

static PyObject *py_isas(PyObject *m, PyObject *a)
{
    (void)m, (void)a;
    size_t n = 0;
    const mha_isa *list = mha_isas(&n);
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        PyObject *t = Py_BuildValue("(siO)", mha_isa_name(list[i]), (int)list[i],
                                    mha_isa_available(list[i]) ? Py_True : Py_False);
        if (!t) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"version", py_version, METH_NOARGS, "mha_version()"},
    {"isas", py_isas, METH_NOARGS,
     "[(name, value, available)] for every ISA libmha knows, best first."},
    {"attention", (PyCFunction)(void (*)(void))py_attention, METH_VARARGS | METH_KEYWORDS,
     "attention(engine, q, k, v, out, *, layout='bhsd', keep=None, bias=None, "
     "causal=0, scale=0.0, weights=None, key_lengths=None, out_layout=None, "
     "key_keep=None, window=None, softcap=0.0, sinks=None, lse=None, "
     "kv_dtype=None, k_scales=None, v_scales=None)\n\n"
     "mha_attention on views of the arrays, in place."},
    {"quantize", (PyCFunction)(void (*)(void))py_quantize, METH_VARARGS | METH_KEYWORDS,
     "quantize(x, codes, scales, kv_dtype, *, layout='bshd')\n\n"
     "mha_quantize of x into codes, the scales computed into scales."},
    {"attention_varlen", (PyCFunction)(void (*)(void))py_attention_varlen,
     METH_VARARGS | METH_KEYWORDS,
     "attention_varlen(engine, q, k, v, out, cu_seqlens_q, *, cu_seqlens_k=None, "
     "block_table=None, seqlens=None, kv_layout='bshd', causal=0, scale=0.0, "
     "window=None, softcap=0.0, sinks=None)\n\nmha_attention_varlen on packed "
     "[total, H, d] views (keys packed or a paged pool), in place."},
    {"quantize_paged", (PyCFunction)(void (*)(void))py_quantize_paged,
     METH_VARARGS | METH_KEYWORDS,
     "quantize_paged(x, pool, scales, slots, kv_dtype, *, kv_layout='bshd')\n\n"
     "mha_quantize_paged: tokens of x into the pool's slots, scales computed."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_mha", "libmha's C binding (see libmha).", -1, methods,
    NULL, NULL, NULL, NULL};

static PyObject *new_exc(PyObject *m, const char *name, PyObject *bases, const char *doc)
{
    char full[64];
    snprintf(full, sizeof full, "libmha.%s", name);
    PyObject *e = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
    Py_DECREF(bases);
    if (e && PyModule_AddObjectRef(m, name, e) < 0)
        Py_CLEAR(e);
    return e;
}

PyMODINIT_FUNC PyInit__mha(void)
{
    if (PyType_Ready(&EngineType) < 0 || PyType_Ready(&LayerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "Engine", (PyObject *)&EngineType) < 0 ||
        PyModule_AddObjectRef(m, "Layer", (PyObject *)&LayerType) < 0)
        goto fail;
    Error = new_exc(m, "Error", Py_BuildValue("(O)", PyExc_Exception),
                    "A call libmha refused; .status is the mha_status value.");
    if (!Error)
        goto fail;
    static const struct { mha_status st; const char *name; PyObject **base; } map[] = {
        {MHA_ERR_NULL_POINTER, "NullPointerError", &PyExc_ValueError},
        {MHA_ERR_BAD_SHAPE, "ShapeError", &PyExc_ValueError},
        {MHA_ERR_BAD_STRIDE, "StrideError", &PyExc_ValueError},
        {MHA_ERR_BAD_MASK, "MaskError", &PyExc_ValueError},
        {MHA_ERR_OVERFLOW, "SizeOverflowError", &PyExc_OverflowError},
        {MHA_ERR_OUT_OF_MEMORY, "OutOfMemoryError", &PyExc_MemoryError},
        {MHA_ERR_UNSUPPORTED, "UnsupportedError", &PyExc_ValueError},
        {MHA_ERR_BAD_ARGUMENT, "ArgumentError", &PyExc_ValueError},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        char doc[96];
        snprintf(doc, sizeof doc, "libmha status %d (%s).", (int)map[i].st,
                 mha_status_string(map[i].st));
        status_exc[map[i].st] = new_exc(m, map[i].name,
                                        Py_BuildValue("(OO)", Error, *map[i].base), doc);
        if (!status_exc[map[i].st])
            goto fail;
    }
    DTypeError = new_exc(m, "DTypeError",
                         Py_BuildValue("(OO)", status_exc[MHA_ERR_UNSUPPORTED],
                                       PyExc_TypeError),
                         "An array of a dtype libmha does not take there.");
    DeviceError = new_exc(m, "DeviceError",
                          Py_BuildValue("(O)", status_exc[MHA_ERR_UNSUPPORTED]),
                          "An array that is not in CPU memory.");
    if (!DTypeError || !DeviceError)
        goto fail;
    PyModule_AddIntConstant(m, "CAUSAL_NONE", MHA_CAUSAL_NONE);
    PyModule_AddIntConstant(m, "CAUSAL_TOP_LEFT", MHA_CAUSAL_TOP_LEFT);
    PyModule_AddIntConstant(m, "CAUSAL_BOTTOM_RIGHT", MHA_CAUSAL_BOTTOM_RIGHT);
    PyModule_AddIntConstant(m, "MAX_THREADS", MHA_MAX_THREADS);
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}

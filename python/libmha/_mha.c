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
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mha.h>

/* ------------------------------------------------------------------ */
/* DLPack ABI (dlpack.h, v0.8 unversioned capsule "dltensor")          */

typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* elements; NULL: compact row-major */
    uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
enum { DL_CPU = 1 };
enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_BFLOAT = 4, DL_BOOL = 6 };

/* ------------------------------------------------------------------ */
/* Exceptions                                                          */

static PyObject *Error, *status_exc[MHA_ERR_BAD_ARGUMENT + 1];
static PyObject *DTypeError, *DeviceError;

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

static void raise_fmt(PyObject *cls, mha_status st, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    PyOS_vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    raise_with(cls, st, msg);
}

/* ------------------------------------------------------------------ */
/* Array views                                                         */

enum vkind { VK_F32, VK_F16, VK_BF16, VK_BOOL, VK_U8, VK_I32, VK_OTHER };
static const char *const vkind_name[] = {"float32", "float16", "bfloat16",
                                         "bool", "uint8", "int32", "other"};
#define MAX_DIMS 8

typedef struct {
    char *data;
    int ndim;
    int64_t shape[MAX_DIMS];
    int64_t strides[MAX_DIMS]; /* elements */
    int kind;
    char dtype[24]; /* a name for messages */
    int has_buf;
    Py_buffer buf;
    PyObject *capsule;
    DLManagedTensor *dl;
    PyObject *owner;
} view;

static void view_release(view *v)
{
    if (v->has_buf)
        PyBuffer_Release(&v->buf);
    v->has_buf = 0;
    if (v->dl && v->dl->deleter)
        v->dl->deleter(v->dl);
    v->dl = NULL;
    Py_CLEAR(v->capsule);
    Py_CLEAR(v->owner);
}

static void set_kind(view *v, int kind, const char *name)
{
    v->kind = kind;
    snprintf(v->dtype, sizeof v->dtype, "%s", name ? name : vkind_name[kind]);
}

static int view_from_buffer(PyObject *obj, const char *name, int writable, view *v)
{
    int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &v->buf, flags) < 0) {
        if (writable && PyObject_GetBuffer(obj, &v->buf, flags & ~PyBUF_WRITABLE) == 0) {
            PyBuffer_Release(&v->buf);
            PyErr_Clear();
            raise_fmt(status_exc[MHA_ERR_BAD_ARGUMENT], MHA_ERR_BAD_ARGUMENT,
                      "%s is read-only", name);
        }
        return -1;
    }
    v->has_buf = 1;
    if (v->buf.ndim > MAX_DIMS) {
        raise_fmt(status_exc[MHA_ERR_BAD_SHAPE], MHA_ERR_BAD_SHAPE,
                  "%s has %d dimensions", name, v->buf.ndim);
        return -1;
    }
    const char *f = v->buf.format ? v->buf.format : "B";
    int big = 0;
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    else if (*f == '>' || *f == '!')
        big = 1, f++;
    Py_ssize_t isz = v->buf.itemsize;
    if (!big && strcmp(f, "f") == 0 && isz == 4)
        set_kind(v, VK_F32, NULL);
    else if (!big && strcmp(f, "e") == 0 && isz == 2)
        set_kind(v, VK_F16, NULL);
    else if (strcmp(f, "?") == 0 && isz == 1)
        set_kind(v, VK_BOOL, NULL);
    else if (strcmp(f, "B") == 0 && isz == 1)
        set_kind(v, VK_U8, NULL);
    else if (!big && (strcmp(f, "i") == 0 || strcmp(f, "l") == 0) && isz == 4)
        set_kind(v, VK_I32, NULL);
    else {
        char d[24];
        snprintf(d, sizeof d, "%s%s(%zd bytes)", big ? "big-endian " : "",
                 strcmp(f, "d") == 0 ? "float64" : f, (Py_ssize_t)isz);
        if (strcmp(f, "d") == 0 && !big)
            snprintf(d, sizeof d, "float64");
        set_kind(v, VK_OTHER, d);
    }
    v->data = v->buf.buf;
    v->ndim = v->buf.ndim;
    for (int i = 0; i < v->ndim; i++) {
        v->shape[i] = v->buf.shape[i];
        Py_ssize_t s = v->buf.strides[i];
        if (s % isz != 0) {
            raise_fmt(status_exc[MHA_ERR_BAD_STRIDE], MHA_ERR_BAD_STRIDE,
                      "%s: stride %zd bytes of axis %d is not a multiple of its "
                      "element size (%zd)", name, s, i, isz);
            return -1;
        }
        v->strides[i] = s / isz;
    }
    return 0;
}

static const char *device_name(int t)
{
    switch (t) {
    case 2: return "CUDA";
    case 3: return "CUDA host";
    case 4: return "OpenCL";
    case 7: return "Vulkan";
    case 8: return "Metal";
    case 10: return "ROCm";
    case 14: return "oneAPI";
    default: return "non-CPU";
    }
}

static int view_from_dlpack(PyObject *obj, const char *name, view *v)
{
    PyObject *dev = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
    if (!dev)
        return -1;
    int type = -1, id = 0;
    if (!PyArg_ParseTuple(dev, "ii", &type, &id)) {
        Py_DECREF(dev);
        return -1;
    }
    Py_DECREF(dev);
    if (type != DL_CPU) {
        raise_fmt(DeviceError, MHA_ERR_UNSUPPORTED,
                  "%s is on a %s device (DLPack device type %d, id %d); libmha "
                  "computes on the CPU: move it there first (e.g. .cpu())",
                  name, device_name(type), type, id);
        return -1;
    }
    PyObject *cap = PyObject_CallMethod(obj, "__dlpack__", NULL);
    if (!cap)
        return -1;
    DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
    if (!m) {
        Py_DECREF(cap);
        return -1;
    }
    /* Consumed: the producer's capsule destructor now leaves it to us. */
    if (PyCapsule_SetName(cap, "used_dltensor") < 0) {
        Py_DECREF(cap);
        return -1;
    }
    v->capsule = cap;
    v->dl = m;
    const DLTensor *t = &m->dl_tensor;
    if (t->ndim > MAX_DIMS || t->ndim < 0) {
        raise_fmt(status_exc[MHA_ERR_BAD_SHAPE], MHA_ERR_BAD_SHAPE,
                  "%s has %d dimensions", name, (int)t->ndim);
        return -1;
    }
    const DLDataType d = t->dtype;
    if (d.lanes == 1 && d.code == DL_FLOAT && d.bits == 32)
        set_kind(v, VK_F32, NULL);
    else if (d.lanes == 1 && d.code == DL_FLOAT && d.bits == 16)
        set_kind(v, VK_F16, NULL);
    else if (d.lanes == 1 && d.code == DL_BFLOAT && d.bits == 16)
        set_kind(v, VK_BF16, NULL);
    else if (d.lanes == 1 && d.code == DL_BOOL && d.bits == 8)
        set_kind(v, VK_BOOL, NULL);
    else if (d.lanes == 1 && d.code == DL_UINT && d.bits == 8)
        set_kind(v, VK_U8, NULL);
    else if (d.lanes == 1 && d.code == DL_INT && d.bits == 32)
        set_kind(v, VK_I32, NULL);
    else {
        static const char *codes[] = {"int", "uint", "float", "opaque", "bfloat",
                                      "complex", "bool"};
        char n[24];
        snprintf(n, sizeof n, "%s%u%s", d.code < 7 ? codes[d.code] : "code?",
                 (unsigned)d.bits, d.lanes != 1 ? "xN" : "");
        set_kind(v, VK_OTHER, n);
    }
    v->data = (char *)t->data + t->byte_offset;
    v->ndim = t->ndim;
    int64_t run = 1;
    for (int i = v->ndim - 1; i >= 0; i--) {
        v->shape[i] = t->shape[i];
        v->strides[i] = t->strides ? t->strides[i] : run;
        run *= t->shape[i];
    }
    return 0;
}

static int view_from_interface(PyObject *obj, PyObject *ai, const char *name,
                               int writable, view *v)
{
    if (!PyDict_Check(ai)) {
        PyErr_Format(PyExc_TypeError, "%s.__array_interface__ is not a dict", name);
        return -1;
    }
    PyObject *shape = PyDict_GetItemString(ai, "shape");
    PyObject *typestr = PyDict_GetItemString(ai, "typestr");
    PyObject *data = PyDict_GetItemString(ai, "data");
    PyObject *strides = PyDict_GetItemString(ai, "strides");
    PyObject *mask = PyDict_GetItemString(ai, "mask");
    if (!shape || !PyTuple_Check(shape) || !typestr || !PyUnicode_Check(typestr) ||
        !data || !PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2) {
        PyErr_Format(PyExc_TypeError,
                     "%s.__array_interface__ lacks shape, typestr or a (pointer, "
                     "read-only) data tuple", name);
        return -1;
    }
    if (mask && mask != Py_None) {
        PyErr_Format(PyExc_TypeError, "%s: masked arrays are not supported", name);
        return -1;
    }
    const char *ts = PyUnicode_AsUTF8(typestr);
    if (!ts)
        return -1;
    int isz = 0;
    if (strcmp(ts, "<f4") == 0) set_kind(v, VK_F32, NULL), isz = 4;
    else if (strcmp(ts, "<f2") == 0) set_kind(v, VK_F16, NULL), isz = 2;
    else if (strcmp(ts, "|b1") == 0) set_kind(v, VK_BOOL, NULL), isz = 1;
    else if (strcmp(ts, "|u1") == 0) set_kind(v, VK_U8, NULL), isz = 1;
    else if (strcmp(ts, "<i4") == 0) set_kind(v, VK_I32, NULL), isz = 4;
    else set_kind(v, VK_OTHER, ts), isz = 1;
    void *ptr = PyLong_AsVoidPtr(PyTuple_GET_ITEM(data, 0));
    if (PyErr_Occurred())
        return -1;
    if (writable && PyObject_IsTrue(PyTuple_GET_ITEM(data, 1))) {
        raise_fmt(status_exc[MHA_ERR_BAD_ARGUMENT], MHA_ERR_BAD_ARGUMENT,
                  "%s is read-only", name);
        return -1;
    }
    Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    if (nd > MAX_DIMS) {
        raise_fmt(status_exc[MHA_ERR_BAD_SHAPE], MHA_ERR_BAD_SHAPE,
                  "%s has %zd dimensions", name, nd);
        return -1;
    }
    v->ndim = (int)nd;
    int64_t run = 1;
    for (int i = v->ndim - 1; i >= 0; i--) {
        v->shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        if (strides && strides != Py_None) {
            long long s = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, i));
            if (s % isz != 0) {
                raise_fmt(status_exc[MHA_ERR_BAD_STRIDE], MHA_ERR_BAD_STRIDE,
                          "%s: stride %lld bytes of axis %d is not a multiple of "
                          "its element size (%d)", name, s, i, isz);
                return -1;
            }
            v->strides[i] = s / isz;
        } else {
            v->strides[i] = run;
        }
        run *= v->shape[i];
    }
    if (PyErr_Occurred())
        return -1;
    v->data = ptr;
    Py_INCREF(obj);
    v->owner = obj;
    return 0;
}

/* Views obj in place. Writable views are only taken of outputs the Python
 * layer allocates, through the buffer protocol. */
static int view_get(PyObject *obj, const char *name, int writable, view *v)
{
    memset(v, 0, sizeof *v);
    if (PyObject_CheckBuffer(obj))
        return view_from_buffer(obj, name, writable, v);
    if (PyObject_HasAttrString(obj, "__dlpack_device__") &&
        PyObject_HasAttrString(obj, "__dlpack__")) {
        if (view_from_dlpack(obj, name, v) < 0) {
            view_release(v);
            return -1;
        }
        return 0;
    }
    PyObject *ai = PyObject_GetAttrString(obj, "__array_interface__");
    if (ai) {
        int r = view_from_interface(obj, ai, name, writable, v);
        Py_DECREF(ai);
        if (r < 0)
            view_release(v);
        return r;
    }
    PyErr_Clear();
    raise_fmt(DTypeError, MHA_ERR_UNSUPPORTED,
              "%s is a %s, not an array: libmha takes objects with the buffer "
              "protocol, DLPack (__dlpack__) or __array_interface__",
              name, Py_TYPE(obj)->tp_name);
    return -1;
}

static int need_contiguous_last(const view *v, const char *name)
{
    if (v->ndim > 0 && v->shape[v->ndim - 1] > 1 && v->strides[v->ndim - 1] != 1) {
        raise_fmt(status_exc[MHA_ERR_BAD_STRIDE], MHA_ERR_BAD_STRIDE,
                  "%s: the last axis has a stride of %lld elements; libmha needs "
                  "it contiguous (stride 1): pass a contiguous copy",
                  name, (long long)v->strides[v->ndim - 1]);
        return -1;
    }
    return 0;
}

/* Every axis packed row-major (the C API takes these as bare pointers). */
static int need_packed(const view *v, const char *name)
{
    int64_t run = 1;
    for (int i = v->ndim - 1; i >= 0; i--) {
        if (v->shape[i] > 1 && v->strides[i] != run) {
            raise_fmt(status_exc[MHA_ERR_BAD_STRIDE], MHA_ERR_BAD_STRIDE,
                      "%s must be C-contiguous (axis %d has stride %lld, packed "
                      "would be %lld)", name, i, (long long)v->strides[i],
                      (long long)run);
            return -1;
        }
        run *= v->shape[i];
    }
    return 0;
}

static int need_kind(const view *v, const char *name, int kind)
{
    if (v->kind != kind) {
        raise_fmt(DTypeError, MHA_ERR_UNSUPPORTED, "%s has dtype %s; libmha takes %s here",
                  name, v->dtype, vkind_name[kind]);
        return -1;
    }
    return 0;
}

static void shape_str(const view *v, char *s, size_t n)
{
    size_t k = (size_t)snprintf(s, n, "(");
    for (int i = 0; i < v->ndim && k < n; i++)
        k += (size_t)snprintf(s + k, n - k, "%s%lld", i ? ", " : "",
                              (long long)v->shape[i]);
    if (k < n)
        snprintf(s + k, n - k, "%s)", v->ndim == 1 ? "," : "");
}

static int need_shape(const view *v, const char *name, int nd, const int64_t *shape,
                      const char *what)
{
    int ok = v->ndim == nd;
    for (int i = 0; ok && i < nd; i++)
        ok = v->shape[i] == shape[i];
    if (!ok) {
        char got[128];
        shape_str(v, got, sizeof got);
        raise_fmt(status_exc[MHA_ERR_BAD_SHAPE], MHA_ERR_BAD_SHAPE,
                  "%s has shape %s; expected %s", name, got, what);
        return -1;
    }
    return 0;
}

/* q, k, v or out as an mha_tensor: 4-D [B,H,S,D] ("bhsd") or [B,S,H,D]
 * ("bshd"); 3-D [B,S,D] is one head. */
static int tensor_of(const view *v, const char *name, int bhsd, mha_tensor *t)
{
    memset(t, 0, sizeof *t);
    if (v->ndim != 3 && v->ndim != 4) {
        raise_fmt(status_exc[MHA_ERR_BAD_SHAPE], MHA_ERR_BAD_SHAPE,
                  "%s has %d dimensions; expected 4 (%s) or 3 ([B, L, d])", name,
                  v->ndim, bhsd ? "[B, H, L, d]" : "[B, L, H, d]");
        return -1;
    }
    if (need_contiguous_last(v, name) < 0)
        return -1;
    switch (v->kind) {
    case VK_F32: t->dtype = MHA_F32; break;
    case VK_F16: t->dtype = MHA_F16; break;
    case VK_BF16: t->dtype = MHA_BF16; break;
    default:
        raise_fmt(DTypeError, MHA_ERR_UNSUPPORTED,
                  "%s has dtype %s; libmha takes float32, float16 or bfloat16",
                  name, v->dtype);
        return -1;
    }
    t->data = v->data;
    if (v->ndim == 3) {
        t->batch = v->shape[0], t->seq = v->shape[1], t->heads = 1, t->dim = v->shape[2];
        t->stride_batch = v->strides[0], t->stride_seq = v->strides[1];
        t->stride_head = 0;
    } else if (bhsd) {
        t->batch = v->shape[0], t->heads = v->shape[1], t->seq = v->shape[2];
        t->dim = v->shape[3];
        t->stride_batch = v->strides[0], t->stride_head = v->strides[1];
        t->stride_seq = v->strides[2];
    } else {
        t->batch = v->shape[0], t->seq = v->shape[1], t->heads = v->shape[2];
        t->dim = v->shape[3];
        t->stride_batch = v->strides[0], t->stride_seq = v->strides[1];
        t->stride_head = v->strides[2];
    }
    return 0;
}

/* A keep or bias array broadcast (NumPy rules) to [B, H, Lq, Lk]: the
 * three outer strides, with 0 on broadcast axes. */
static int mask_strides(const view *v, const char *name, const int64_t dims[4],
                        int64_t st[3])
{
    char got[128];
    if (v->ndim > 4 || v->ndim < 1) {
        shape_str(v, got, sizeof got);
        raise_fmt(status_exc[MHA_ERR_BAD_MASK], MHA_ERR_BAD_MASK,
                  "%s has shape %s; expected at most 4 dimensions broadcasting to "
                  "[B, H, Lq, Lk] = [%lld, %lld, %lld, %lld]", name, got,
                  (long long)dims[0], (long long)dims[1], (long long)dims[2],
                  (long long)dims[3]);
        return -1;
    }
    int64_t s4[4];
    for (int i = 0; i < 4; i++) {
        int j = i - (4 - v->ndim);
        int64_t size = j < 0 ? 1 : v->shape[j];
        int64_t stride = j < 0 ? 0 : v->strides[j];
        if (size == dims[i])
            s4[i] = dims[i] == 1 ? 0 : stride;
        else if (size == 1 && i < 3)
            s4[i] = 0;
        else {
            shape_str(v, got, sizeof got);
            raise_fmt(status_exc[MHA_ERR_BAD_MASK], MHA_ERR_BAD_MASK,
                      "%s has shape %s, which does not broadcast to [B, H, Lq, Lk] "
                      "= [%lld, %lld, %lld, %lld]%s", name, got,
                      (long long)dims[0], (long long)dims[1], (long long)dims[2],
                      (long long)dims[3],
                      i == 3 && size == 1 ? " (its last axis must be Lk)" : "");
            return -1;
        }
    }
    if (need_contiguous_last(v, name) < 0)
        return -1;
    st[0] = s4[0], st[1] = s4[1], st[2] = s4[2];
    return 0;
}

/* keep (bool/uint8), bias (float32), key_lengths (int32 [B]) into *m.
 * views[0..2] receive what must stay alive during the call. */
static int mask_of(PyObject *keep, PyObject *bias, PyObject *lengths, int causal,
                   const int64_t dims[4], mha_mask *m, view views[3], int *any)
{
    memset(m, 0, sizeof *m);
    m->causal = (mha_causal)causal; /* the library checks the value */
    *any = causal != 0;
    if (keep && keep != Py_None) {
        if (view_get(keep, "keep mask", 0, &views[0]) < 0)
            return -1;
        if (views[0].kind != VK_BOOL && views[0].kind != VK_U8) {
            raise_fmt(DTypeError, MHA_ERR_UNSUPPORTED,
                      "the boolean mask has dtype %s; libmha takes bool or uint8",
                      views[0].dtype);
            return -1;
        }
        int64_t st[3];
        if (mask_strides(&views[0], "the boolean mask", dims, st) < 0)
            return -1;
        m->keep = (const uint8_t *)views[0].data;
        m->keep_stride_batch = st[0], m->keep_stride_head = st[1];
        m->keep_stride_query = st[2];
        *any = 1;
    }
    if (bias && bias != Py_None) {
        if (view_get(bias, "float mask", 0, &views[1]) < 0)
            return -1;
        if (need_kind(&views[1], "the float mask", VK_F32) < 0)
            return -1;
        int64_t st[3];
        if (mask_strides(&views[1], "the float mask", dims, st) < 0)
            return -1;
        m->bias = (const float *)views[1].data;
        m->bias_stride_batch = st[0], m->bias_stride_head = st[1];
        m->bias_stride_query = st[2];
        *any = 1;
    }
    if (lengths && lengths != Py_None) {
        if (view_get(lengths, "key_lengths", 0, &views[2]) < 0 ||
            need_kind(&views[2], "key_lengths", VK_I32) < 0)
            return -1;
        int64_t b[1] = {dims[0]};
        if (need_shape(&views[2], "key_lengths", 1, b, "[B]") < 0 ||
            need_packed(&views[2], "key_lengths") < 0)
            return -1;
        m->key_lengths = (const int32_t *)views[2].data;
        *any = 1;
    }
    return 0;
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
    static char *kwlist[] = {"num_threads", "isa", NULL};
    int threads = 0;
    PyObject *isa = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|iO:Engine", kwlist, &threads, &isa))
        return -1;
    mha_config cfg = {0};
    cfg.num_threads = threads;
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
    .tp_doc = "Engine(num_threads=0, isa='auto')\n\nA kernel table and a thread "
              "count (mha_engine). Immutable; any number of threads may call "
              "through one at once. num_threads=0 uses OpenMP's default; isa is "
              "a name of libmha.isas() or 'auto'.",
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

/* q of a half dtype widened to a packed [B, S, H, D] float32 copy (the C API
 * takes q in float32 only). */
static float *widen_q(const mha_tensor *q)
{
    int64_t rows = q->batch * q->seq * q->heads;
    float *w = malloc((size_t)(rows * q->dim) * sizeof(float) + 1);
    if (!w)
        return NULL;
    const uint16_t *src = q->data;
    float *dst = w;
    for (int64_t b = 0; b < q->batch; b++)
        for (int64_t s = 0; s < q->seq; s++)
            for (int64_t h = 0; h < q->heads; h++, dst += q->dim) {
                const uint16_t *row = src + b * q->stride_batch + s * q->stride_seq +
                                      h * q->stride_head;
                if (q->dtype == MHA_F16)
                    mha_f16_to_f32(row, (size_t)q->dim, dst);
                else
                    mha_bf16_to_f32(row, (size_t)q->dim, dst);
            }
    return w;
}

static PyObject *py_attention(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    static char *kwlist[] = {"engine", "q", "k", "v", "out", "layout", "keep",
                             "bias", "causal", "scale", "weights", "key_lengths",
                             NULL};
    PyObject *eo, *qo, *ko, *vo, *oo, *keep = NULL, *bias = NULL, *wo = NULL,
                                         *lo = NULL;
    const char *layout = "bhsd";
    int causal = 0;
    double scale = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO|$sOOidOO:attention", kwlist,
                                     &eo, &qo, &ko, &vo, &oo, &layout, &keep, &bias,
                                     &causal, &scale, &wo, &lo))
        return NULL;
    const mha_engine *engine;
    if (get_engine(eo, &engine) < 0)
        return NULL;
    int bhsd = strcmp(layout, "bhsd") == 0;
    if (!bhsd && strcmp(layout, "bshd") != 0) {
        PyErr_SetString(PyExc_ValueError, "layout must be 'bhsd' or 'bshd'");
        return NULL;
    }
    view vq, vk, vv, vo_, vw, mv[3];
    memset(&vw, 0, sizeof vw);
    memset(mv, 0, sizeof mv);
    memset(&vq, 0, sizeof vq), memset(&vk, 0, sizeof vk);
    memset(&vv, 0, sizeof vv), memset(&vo_, 0, sizeof vo_);
    PyObject *result = NULL;
    float *qwide = NULL;
    mha_attention_args a;
    memset(&a, 0, sizeof a);
    mha_mask mask;
    int any_mask = 0;
    if (view_get(qo, "q", 0, &vq) < 0 || tensor_of(&vq, "q", bhsd, &a.q) < 0 ||
        view_get(ko, "k", 0, &vk) < 0 || tensor_of(&vk, "k", bhsd, &a.k) < 0 ||
        view_get(vo, "v", 0, &vv) < 0 || tensor_of(&vv, "v", bhsd, &a.v) < 0 ||
        view_get(oo, "out", 1, &vo_) < 0 || tensor_of(&vo_, "out", bhsd, &a.out) < 0)
        goto done;
    if (a.out.dtype != MHA_F32) {
        need_kind(&vo_, "out", VK_F32);
        goto done;
    }
    int64_t dims[4] = {a.q.batch, a.q.heads, a.q.seq, a.k.seq};
    if (mask_of(keep, bias, lo, causal, dims, &mask, mv, &any_mask) < 0)
        goto done;
    a.mask = any_mask ? &mask : NULL;
    a.scale = (float)scale;
    if (wo && wo != Py_None) {
        if (view_get(wo, "weights", 1, &vw) < 0 || need_kind(&vw, "weights", VK_F32) < 0 ||
            need_shape(&vw, "weights", 4, dims, "[B, H, Lq, Lk]") < 0 ||
            need_packed(&vw, "weights") < 0)
            goto done;
        a.weights = (float *)vw.data;
    }
    mha_status st;
    int oom = 0;
    Py_BEGIN_ALLOW_THREADS
    if (a.q.dtype != MHA_F32 && a.q.batch > 0 && a.q.seq > 0 && a.q.heads > 0 &&
        a.q.dim > 0) {
        qwide = widen_q(&a.q);
        if (qwide)
            a.q = mha_tensor_bshd(qwide, a.q.batch, a.q.seq, a.q.heads, a.q.dim);
        else
            oom = 1;
    }
    st = oom ? MHA_ERR_OUT_OF_MEMORY : mha_attention(engine, &a);
    Py_END_ALLOW_THREADS
    if (oom)
        PyErr_NoMemory();
    else if (st != MHA_OK)
        raise_last(st);
    else
        result = Py_NewRef(Py_None);
done:
    free(qwide);
    view_release(&vq), view_release(&vk), view_release(&vv), view_release(&vo_);
    view_release(&vw);
    for (int i = 0; i < 3; i++)
        view_release(&mv[i]);
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
    if (st != MHA_OK)
        raise_last(st);
    else
        result = Py_NewRef(Py_None);
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
     "causal=0, scale=0.0, weights=None, key_lengths=None)\n\nmha_attention on "
     "views of the arrays, in place."},
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

/* Array views for libmha._mha: the buffer protocol, DLPack and
 * __array_interface__ read in place, and the C tensor and mask views built
 * from them. See _mha.c and docs/python.md. */
#include "_mha.h"

static const char *const vkind_name[] = {"float32", "float16", "bfloat16",
                                         "bool", "uint8", "int32", "int8",
                                         "int64", "other"};

void view_release(view *v)
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
    else if (strcmp(f, "b") == 0 && isz == 1)
        set_kind(v, VK_I8, NULL);
    else if (!big && (strcmp(f, "q") == 0 || strcmp(f, "l") == 0) && isz == 8)
        set_kind(v, VK_I64, NULL);
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
    else if (d.lanes == 1 && d.code == DL_INT && d.bits == 8)
        set_kind(v, VK_I8, NULL);
    else if (d.lanes == 1 && d.code == DL_INT && d.bits == 64)
        set_kind(v, VK_I64, NULL);
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
    else if (strcmp(ts, "|i1") == 0) set_kind(v, VK_I8, NULL), isz = 1;
    else if (strcmp(ts, "<i8") == 0) set_kind(v, VK_I64, NULL), isz = 8;
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
int view_get(PyObject *obj, const char *name, int writable, view *v)
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
int need_packed(const view *v, const char *name)
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

int need_kind(const view *v, const char *name, int kind)
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

int need_shape(const view *v, const char *name, int nd, const int64_t *shape,
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
int tensor_of(const view *v, const char *name, int bhsd, mha_tensor *t)
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

/* The storage dtype of an 8-bit k or v: int8 codes are MHA_I8 unless
 * code_dtype names another; uint8 codes (NumPy has no fp8 type; a torch
 * float8 tensor arrives as .view(torch.uint8)) need code_dtype, one of
 * mha_dtype_name's 8-bit names. */
int code_dtype_of(const view *v, const char *name, const char *code_dtype,
                         mha_dtype *dt)
{
    static const mha_dtype codes[] = {MHA_I8, MHA_FP8_E4M3, MHA_FP8_E5M2};
    if (!code_dtype) {
        if (v->kind == VK_I8) {
            *dt = MHA_I8;
            return 0;
        }
        raise_fmt(DTypeError, MHA_ERR_UNSUPPORTED,
                  "%s holds uint8 codes: say which with kv_dtype='fp8_e4m3' or "
                  "'fp8_e5m2' (int8 codes are 'i8')", name);
        return -1;
    }
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (strcmp(code_dtype, mha_dtype_name(codes[i])) == 0) {
            *dt = codes[i];
            return 0;
        }
    raise_fmt(status_exc[MHA_ERR_BAD_ARGUMENT], MHA_ERR_BAD_ARGUMENT,
              "kv_dtype '%s' is not one of 'i8', 'fp8_e4m3', 'fp8_e5m2'", code_dtype);
    return -1;
}

/* A float32 array of scales for the rows of t (its [B, L, H] or, with
 * bhsd, [B, H, L]; [B, L] for a 3-D tensor), broadcast NumPy's way: its
 * axes align with the rows' last axes, and an axis of size 1 (or a
 * missing one) shares one scale along it (stride 0): shape () is one
 * scale for the tensor, [H] (bshd) or [H, 1] (bhsd) one per head. */
int scales_of(PyObject *obj, const char *name, int writable, int bhsd, int nr,
              mha_tensor *t, view *sv)
{
    if (view_get(obj, name, writable, sv) < 0 || need_kind(sv, name, VK_F32) < 0)
        return -1;
    int64_t rows[3], stride[3] = {0, 0, 0};
    if (nr == 2)
        rows[0] = t->batch, rows[1] = t->seq;
    else if (bhsd)
        rows[0] = t->batch, rows[1] = t->heads, rows[2] = t->seq;
    else
        rows[0] = t->batch, rows[1] = t->seq, rows[2] = t->heads;
    if (sv->ndim > nr) {
        raise_fmt(status_exc[MHA_ERR_BAD_SHAPE], MHA_ERR_BAD_SHAPE,
                  "%s has %d dimensions; the rows it scales have %d", name,
                  sv->ndim, nr);
        return -1;
    }
    for (int i = 0; i < sv->ndim; i++) {
        int r = nr - sv->ndim + i;
        if (sv->shape[i] == rows[r])
            stride[r] = rows[r] == 1 ? 0 : sv->strides[i];
        else if (sv->shape[i] != 1) {
            raise_fmt(status_exc[MHA_ERR_BAD_SHAPE], MHA_ERR_BAD_SHAPE,
                      "%s: axis %d has size %lld; it must be %lld or 1 "
                      "(broadcast)", name, i, (long long)sv->shape[i],
                      (long long)rows[r]);
            return -1;
        }
        if (stride[r] < 0) {
            raise_fmt(status_exc[MHA_ERR_BAD_STRIDE], MHA_ERR_BAD_STRIDE,
                      "%s: axis %d has a negative stride", name, i);
            return -1;
        }
    }
    t->scales.data = (const float *)sv->data;
    if (nr == 2)
        t->scales.stride_batch = stride[0], t->scales.stride_seq = stride[1];
    else if (bhsd)
        t->scales.stride_batch = stride[0], t->scales.stride_head = stride[1],
        t->scales.stride_seq = stride[2];
    else
        t->scales.stride_batch = stride[0], t->scales.stride_seq = stride[1],
        t->scales.stride_head = stride[2];
    return 0;
}

/* k or v with its storage dtype, from a view already taken (3- or 4-D,
 * as tensor_of reads it): a float array as tensor_of takes it (code_dtype,
 * which names what 8-bit codes are, unused), or 8-bit codes (int8, or
 * uint8 with code_dtype) with their scales. Scales given for a float
 * array go to the library, which refuses them (MHA_ERR_UNSUPPORTED), as
 * codes without scales (MHA_ERR_NULL_POINTER): its messages name the
 * field. sv is the caller's to release. */
int kv_tensor(const view *v, const char *name, int bhsd, const char *code_dtype,
              PyObject *scales, view *sv, mha_tensor *t)
{
    char sname[32];
    snprintf(sname, sizeof sname, "%s_scales", name);
    mha_dtype dt = MHA_F32;
    const int codes = v->kind == VK_I8 || v->kind == VK_U8;
    if (codes && code_dtype_of(v, name, code_dtype, &dt) < 0)
        return -1;
    view w = *v;
    if (codes)
        w.kind = VK_F32; /* the shape and strides as tensor_of reads them */
    if (tensor_of(&w, name, bhsd, t) < 0)
        return -1;
    if (codes)
        t->dtype = dt;
    if (scales && scales != Py_None &&
        scales_of(scales, sname, 0, bhsd, v->ndim - 1, t, sv) < 0)
        return -1;
    return 0;
}

/* kv_tensor of obj's view (v, the caller's to release). */
int kv_of(PyObject *obj, const char *name, int bhsd, const char *code_dtype,
          PyObject *scales, view *v, view *sv, mha_tensor *t)
{
    if (view_get(obj, name, 0, v) < 0)
        return -1;
    return kv_tensor(v, name, bhsd, code_dtype, scales, sv, t);
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
int mask_of(PyObject *keep, PyObject *bias, PyObject *lengths, int causal,
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

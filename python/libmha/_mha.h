/* Shared by the files of the libmha._mha extension: the DLPack ABI, the
 * exceptions, and array views (_views.c). See docs/python.md. */
#ifndef MHA_PY_MHA_H
#define MHA_PY_MHA_H
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
/* Exceptions (_mha.c)                                                 */

extern PyObject *Error, *status_exc[MHA_ERR_BAD_ARGUMENT + 1];
extern PyObject *DTypeError, *DeviceError;
/* Raises cls(message) with .status = st. */
void raise_fmt(PyObject *cls, mha_status st, const char *fmt, ...);

/* ------------------------------------------------------------------ */
/* Array views                                                         */

enum vkind { VK_F32, VK_F16, VK_BF16, VK_BOOL, VK_U8, VK_I32, VK_I8, VK_I64, VK_OTHER };
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

/* _views.c */
void view_release(view *v);
int view_get(PyObject *obj, const char *name, int writable, view *v);
int need_packed(const view *v, const char *name);
int need_kind(const view *v, const char *name, int kind);
int need_shape(const view *v, const char *name, int nd, const int64_t *shape,
                      const char *what);
int tensor_of(const view *v, const char *name, int bhsd, mha_tensor *t);
int code_dtype_of(const view *v, const char *name, const char *code_dtype,
                  mha_dtype *dt);
int scales_of(PyObject *obj, const char *name, int writable, int bhsd, int nr,
              mha_tensor *t, view *sv);
int kv_tensor(const view *v, const char *name, int bhsd, const char *code_dtype,
              PyObject *scales, view *sv, mha_tensor *t);
int kv_of(PyObject *obj, const char *name, int bhsd, const char *code_dtype,
          PyObject *scales, view *v, view *sv, mha_tensor *t);
int mask_of(PyObject *keep, PyObject *bias, PyObject *lengths, int causal,
                   const int64_t dims[4], mha_mask *m, view views[3], int *any);

#endif

// SPDX-License-Identifier: MIT
/*
 * _kvcfast.c - the Python binding's per-prompt path in C (optional).
 *
 * An engine hands the binding its prompt as a list of ints (vLLM's
 * prompt_token_ids), a numpy array or a torch tensor, once per request.
 * Through ctypes alone a list costs an array.array built item by item and
 * three foreign calls of about a microsecond each. This module converts a
 * list or tuple of ints to uint32 in one C loop (reading small ints
 * directly, no call per item), takes buffers (array.array, numpy) by
 * address when they already hold 32-bit integers and converts 64-bit ones
 * with a range check, and makes kvc_req_new, kvc_lookup and kvc_req_free
 * as plain C calls.
 *
 * It links nothing: the functions are called through the addresses of the
 * library ctypes loaded (bind()), so both paths use one libkvclient.
 * Anything it does not take, or any value out of range, is answered with
 * None, and the caller goes the ctypes way, which raises the errors the
 * binding documents; so results and errors are those of the ctypes path.
 * The GIL stays held: every call here is memory work of microseconds,
 * with no system call and no wait.
 *
 * Built by `make` against the interpreter's headers (python3-dev) next to
 * libkvclient.so; kvclient loads it when it is there and works without
 * it (KVCLIENT_NO_FAST=1 forces that).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

typedef int (*req_new_fn)(void *c, const uint32_t *tokens, size_t n, const void *extra,
			  size_t extra_len, void **out);
typedef int (*lookup_fn)(void *r);
typedef void (*req_free_fn)(void *r);

static req_new_fn f_req_new;
static lookup_fn f_lookup;
static req_free_fn f_req_free;
static PyObject *zero_int;	/* the int 0, for from_seq */

/* The conversion buffer: the GIL serialises its users. */
static uint32_t *tbuf;
static size_t tcap;

/* More tokens than a request may hold (KVC_MAX_TOKENS, kvclient.h) are
 * not converted here: the ctypes path refuses them (-E2BIG), and this
 * buffer, kept for the process's life, stays at most 16 MiB. */
#define TBUF_MAX (1u << 22)

static uint32_t *tbuf_for(Py_ssize_t n)
{
	if ((size_t)n > TBUF_MAX)
		return NULL;
	if ((size_t)n > tcap) {
		size_t cap = (size_t)n < 4096 ? 4096 : (size_t)n;
		uint32_t *b = PyMem_RawRealloc(tbuf, cap * sizeof(uint32_t));

		if (!b)
			return NULL;
		tbuf = b;
		tcap = cap;
	}
	return tbuf;
}

/* One int in 0..2^32-1, or -1 (not one: the caller falls back). */
static inline int64_t token_of(PyObject *o)
{
	unsigned long v;

	if (PyLong_CheckExact(o)) {
#if PY_VERSION_HEX >= 0x030C0000
		if (PyUnstable_Long_IsCompact((PyLongObject *)o)) {
			Py_ssize_t x = PyUnstable_Long_CompactValue((PyLongObject *)o);

			return x >= 0 && (uint64_t)x <= UINT32_MAX ? (int64_t)x : -1;
		}
#else
		/* CPython 3.11: a small int is one 30-bit digit, its sign in
		 * the size. */
		Py_ssize_t sz = Py_SIZE(o);

		if (sz == 0)
			return 0;
		if (sz == 1)
			return (int64_t)((PyLongObject *)o)->ob_digit[0];
		if (sz < 0)
			return -1;
#endif
	} else if (!PyLong_Check(o)) {
		return -1;
	}
	v = PyLong_AsUnsignedLong(o);
	if (v == (unsigned long)-1 && PyErr_Occurred()) {
		PyErr_Clear();
		return -1;
	}
	return v <= UINT32_MAX ? (int64_t)v : -1;
}

/* A list or tuple of ints into tbuf; false when one is not a token. */
static bool from_seq(PyObject *seq, Py_ssize_t n, uint32_t *out)
{
	PyObject **items = PySequence_Fast_ITEMS(seq);
	Py_ssize_t i;

#if PY_VERSION_HEX < 0x030C0000
	/* CPython 3.11: first a loop with no branch per item that takes
	 * every exact int of one digit (or zero) and notes whether any item
	 * was something else; only then, if one was, the careful loop. */
	size_t odd = 0;

	for (i = 0; i < n; i++) {
		PyObject *o = items[i];
		bool is_int = Py_TYPE(o) == &PyLong_Type;
		/* Another type's fields are not read: zero stands in (a select,
		 * not a branch). */
		PyLongObject *l = (PyLongObject *)(is_int ? o : zero_int);
		size_t sz = (size_t)Py_SIZE(l);

		odd |= (size_t)!is_int | sz >> 1;
		out[i] = (uint32_t)l->ob_digit[0] & -(uint32_t)(sz != 0);
	}
	if (!odd)
		return true;
#endif
	for (i = 0; i < n; i++) {
		int64_t v = token_of(items[i]);

		if (v < 0)
			return false;
		out[i] = (uint32_t)v;
	}
	return true;
}

/* The native-order format character of a one-dimensional buffer, or 0. */
static char fmt_char(const Py_buffer *v)
{
	const char *f = v->format ? v->format : "B";

	if (*f == '@' || *f == '=' || *f == '<')
		f++;
	return f[0] && !f[1] ? f[0] : 0;
}

/*
 * Tokens of obj as (address, count): a list or tuple converted, a buffer
 * of 32-bit integers by address (its view kept in *view), of 64-bit ones
 * converted with a range check. 1: done; 0: not taken (fall back).
 */
/* 64-bit integers into tbuf, each checked to fit 32 bits; 1, or 0 (one
 * does not, or no buffer). */
static int narrow64(const uint64_t *s, Py_ssize_t len, const uint32_t **addr, size_t *n)
{
	uint32_t *b = tbuf_for(len);
	uint64_t high = 0;
	Py_ssize_t i;

	if (!b)
		return 0;
	/* Signed or not, a value is a token when its high half is zero (a
	 * negative one has it all ones): one OR per item, no branch. GCC at
	 * -O2 leaves this loop scalar (7 instructions an item): four items a
	 * step in SSE2, their low halves gathered by one shuffle. */
	i = 0;
#if defined(__SSE2__)
	{
		__m128i hi = _mm_setzero_si128();

		for (; i + 4 <= len; i += 4) {
			__m128i a = _mm_loadu_si128((const __m128i *)(s + i));
			__m128i c = _mm_loadu_si128((const __m128i *)(s + i + 2));

			hi = _mm_or_si128(hi, _mm_or_si128(_mm_srli_epi64(a, 32), _mm_srli_epi64(c, 32)));
			_mm_storeu_si128((__m128i *)(b + i),
					 _mm_castps_si128(_mm_shuffle_ps(_mm_castsi128_ps(a),
									 _mm_castsi128_ps(c),
									 _MM_SHUFFLE(2, 0, 2, 0))));
		}
		high = (uint64_t)_mm_cvtsi128_si64(hi) | (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(hi, hi));
	}
#endif
	for (; i < len; i++) {
		high |= s[i] >> 32;
		b[i] = (uint32_t)s[i];
	}
	if (high)
		return 0;
	*addr = b;
	*n = (size_t)len;
	return 1;
}

/* The names torch_tokens asks a tensor for, interned once, and torch's
 * int32 and int64 dtypes (singletons), held once torch is loaded. */
static PyObject *s_torch, *s_is_cpu, *s_dtype, *s_dim, *s_is_contiguous, *s_numel, *s_data_ptr;
static PyObject *torch_i32, *torch_i64;

static bool names_ready(void)
{
	if (s_data_ptr)
		return true;
	s_torch = PyUnicode_InternFromString("torch");
	s_is_cpu = PyUnicode_InternFromString("is_cpu");
	s_dtype = PyUnicode_InternFromString("dtype");
	s_dim = PyUnicode_InternFromString("dim");
	s_is_contiguous = PyUnicode_InternFromString("is_contiguous");
	s_numel = PyUnicode_InternFromString("numel");
	s_data_ptr = PyUnicode_InternFromString("data_ptr");
	return s_torch && s_is_cpu && s_dtype && s_dim && s_is_contiguous && s_numel && s_data_ptr;
}

/* method() of obj as an int, or -1. */
static long long call_int(PyObject *obj, PyObject *method)
{
	PyObject *a = PyObject_CallMethodNoArgs(obj, method);
	long long v = a && PyLong_Check(a) ? PyLong_AsLongLong(a) : -1;

	Py_XDECREF(a);
	return v;
}

/*
 * A torch tensor (no buffer): a CPU one, one-dimensional and contiguous,
 * of int32 (taken by address) or int64 (narrowed), read from its
 * attributes: is_cpu, dtype, dim(), is_contiguous(), numel(), data_ptr().
 * Six cheap calls (numpy(), the one call that does the same, builds a
 * numpy array and cost several times as much). 1: done; 0: not taken
 * (anything else, a CUDA tensor included: the ctypes way says what is
 * wrong). The caller holds the tensor, so its memory, for the request's
 * kvc_req_new.
 */
static int torch_tokens(PyObject *obj, const uint32_t **addr, size_t *n)
{
	const char *tp = Py_TYPE(obj)->tp_name;
	PyObject *cpu, *dt, *cont;
	long long len, p;
	int kind = 0;

	if ((strcmp(tp, "Tensor") && strcmp(tp, "Parameter")) || !names_ready())
		return 0;
	if (!torch_i64) {
		/* The dtypes, once: torch is loaded (it made this tensor). */
		PyObject *torch = PyImport_GetModule(s_torch);

		if (torch) {
			torch_i32 = PyObject_GetAttrString(torch, "int32");
			torch_i64 = PyObject_GetAttrString(torch, "int64");
			Py_DECREF(torch);
		}
		if (!torch_i32 || !torch_i64) {
			Py_CLEAR(torch_i32);
			Py_CLEAR(torch_i64);
			PyErr_Clear();
			return 0;
		}
	}
	cpu = PyObject_GetAttr(obj, s_is_cpu);
	dt = PyObject_GetAttr(obj, s_dtype);
	if (cpu == Py_True && dt && (dt == torch_i32 || dt == torch_i64))
		kind = dt == torch_i32 ? 4 : 8;
	Py_XDECREF(cpu);
	Py_XDECREF(dt);
	if (kind && call_int(obj, s_dim) == 1) {
		cont = PyObject_CallMethodNoArgs(obj, s_is_contiguous);
		if (cont != Py_True)
			kind = 0;
		Py_XDECREF(cont);
	} else {
		kind = 0;
	}
	len = kind ? call_int(obj, s_numel) : -1;
	p = len >= 0 ? call_int(obj, s_data_ptr) : -1;
	PyErr_Clear();
	if (len < 0 || len > (long long)TBUF_MAX || (len && p <= 0))
		return 0;
	if (kind == 4) {
		*addr = (const uint32_t *)(uintptr_t)p;
		*n = (size_t)len;
		return 1;
	}
	return narrow64((const uint64_t *)(uintptr_t)p, (Py_ssize_t)len, addr, n);
}

static int tokens_of(PyObject *obj, const uint32_t **addr, size_t *n, Py_buffer *view,
		     bool *held)
{
	uint32_t *b;

	*held = false;
	if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) {
		Py_ssize_t len = PySequence_Fast_GET_SIZE(obj);

		b = tbuf_for(len);
		if (!b || !from_seq(obj, len, b))
			return 0;
		*addr = b;
		*n = (size_t)len;
		return 1;
	}
	if (PyBytes_Check(obj) || PyByteArray_Check(obj) || PyUnicode_Check(obj))
		return 0;
	if (!PyObject_CheckBuffer(obj))
		return torch_tokens(obj, addr, n);
	if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)) {
		PyErr_Clear();
		return 0;
	}
	*held = true;
	if (view->ndim != 1 || view->shape[0] > (Py_ssize_t)TBUF_MAX)
		return 0;	/* too long: the ctypes path says so, naming the limit */
	if (view->itemsize == 4 && strchr("IiLl", fmt_char(view))) {
		*addr = view->buf;
		*n = (size_t)view->shape[0];
		return 1;
	}
	if (view->itemsize == 8 && strchr("qQlLnN", fmt_char(view)))
		return narrow64(view->buf, view->shape[0], addr, n);
	return 0;
}

static int extra_of(PyObject *extra, const void **p, size_t *len)
{
	*p = NULL;
	*len = 0;
	if (extra == Py_None)
		return 1;
	if (!PyBytes_CheckExact(extra))
		return 0;
	*p = PyBytes_AS_STRING(extra);
	*len = (size_t)PyBytes_GET_SIZE(extra);
	return 1;
}

/* bind(req_new, lookup, req_free): the library's function addresses. */
static PyObject *fast_bind(PyObject *self, PyObject *args)
{
	unsigned long long a, b, c;

	(void)self;
	if (!PyArg_ParseTuple(args, "KKK", &a, &b, &c))
		return NULL;
	f_req_new = (req_new_fn)(uintptr_t)a;
	f_lookup = (lookup_fn)(uintptr_t)b;
	f_req_free = (req_free_fn)(uintptr_t)c;
	Py_RETURN_NONE;
}

static PyObject *req_result(int rc, void *r)
{
	return rc < 0 ? PyLong_FromLong(rc) : PyLong_FromVoidPtr(r);
}

/*
 * req_new(handle, tokens, extra): kvc_req_new; the request's address (an
 * int > 0), a negative errno, or None when tokens (or extra, bytes or
 * None) is not something taken here.
 */
static PyObject *fast_req_new(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
	const uint32_t *t = NULL;
	const void *ex;
	size_t n = 0, exlen;
	Py_buffer view;
	bool held;
	void *h, *r = NULL;
	int rc, ok;

	(void)self;
	if (nargs != 3 || !f_req_new) {
		PyErr_SetString(PyExc_TypeError, "req_new(handle, tokens, extra) after bind()");
		return NULL;
	}
	h = PyLong_AsVoidPtr(args[0]);
	if (!h && PyErr_Occurred())
		return NULL;
	if (!extra_of(args[2], &ex, &exlen))
		Py_RETURN_NONE;
	ok = tokens_of(args[1], &t, &n, &view, &held);
	rc = ok ? f_req_new(h, t, n, ex, exlen, &r) : 0;
	if (held)
		PyBuffer_Release(&view);
	if (!ok)
		Py_RETURN_NONE;
	return req_result(rc, r);
}

/* req_new_at(handle, address, count, extra): the same for tokens given by
 * address (a torch tensor's data_ptr()). */
static PyObject *fast_req_new_at(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
	const void *ex;
	size_t exlen, n;
	void *h, *t, *r = NULL;
	int rc;

	(void)self;
	if (nargs != 4 || !f_req_new) {
		PyErr_SetString(PyExc_TypeError,
				"req_new_at(handle, address, count, extra) after bind()");
		return NULL;
	}
	h = PyLong_AsVoidPtr(args[0]);
	t = PyLong_AsVoidPtr(args[1]);
	n = PyLong_AsSize_t(args[2]);
	if (PyErr_Occurred())
		return NULL;
	if (!extra_of(args[3], &ex, &exlen))
		Py_RETURN_NONE;
	rc = f_req_new(h, t, n, ex, exlen, &r);
	return req_result(rc, r);
}

/* lookup(request): kvc_lookup's result. */
static PyObject *fast_lookup(PyObject *self, PyObject *arg)
{
	void *r = PyLong_AsVoidPtr(arg);

	(void)self;
	if (!r && PyErr_Occurred())
		return NULL;
	return PyLong_FromLong(f_lookup(r));
}

/* req_free(request): kvc_req_free of a request that holds no granted,
 * unpublished pages (no round trip: the caller knows). */
static PyObject *fast_req_free(PyObject *self, PyObject *arg)
{
	void *r = PyLong_AsVoidPtr(arg);

	(void)self;
	if (!r && PyErr_Occurred())
		return NULL;
	f_req_free(r);
	Py_RETURN_NONE;
}

static PyMethodDef fast_methods[] = {
	{ "bind", fast_bind, METH_VARARGS, "bind(req_new, lookup, req_free) addresses" },
	{ "req_new", (PyCFunction)(void (*)(void))fast_req_new, METH_FASTCALL,
	  "req_new(handle, tokens, extra) -> address, -errno, or None (not taken)" },
	{ "req_new_at", (PyCFunction)(void (*)(void))fast_req_new_at, METH_FASTCALL,
	  "req_new_at(handle, address, count, extra) -> address, -errno, or None" },
	{ "lookup", fast_lookup, METH_O, "lookup(request) -> kvc_lookup's result" },
	{ "req_free", fast_req_free, METH_O, "req_free(request): kvc_req_free, no wait" },
	{ NULL, NULL, 0, NULL },
};

static struct PyModuleDef fast_module = {
	PyModuleDef_HEAD_INIT, "_kvcfast",
	"kvclient's per-prompt path in C (optional; see _kvcfast.c)", -1, fast_methods,
	NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kvcfast(void);

PyMODINIT_FUNC PyInit__kvcfast(void)
{
	if (!zero_int && !(zero_int = PyLong_FromLong(0)))
		return NULL;
	return PyModule_Create(&fast_module);
}

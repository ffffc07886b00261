#include "phase_labels.h"

#include <stdio.h>
#include <string.h>

#include "phases.h"

#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>
#endif

/* A local of frame (or the first item of it, a tuple: the optimizer's
 * step wrapper takes *args): a new reference, or NULL (no error set). */
static PyObject *
local_object(PyFrameObject *frame, const char *name, int first_item)
{
    if (frame == NULL)
        return NULL;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *v = PyFrame_GetVarString(frame, name);
#elif PY_VERSION_HEX >= 0x030B0000
    PyObject *locals = PyFrame_GetLocals(frame);
    PyObject *v = NULL;
    if (locals != NULL) {
        v = PyMapping_GetItemString(locals, name);
        Py_DECREF(locals);
    }
#else
    /* 3.10: the frame's struct is public; f_locals after the copy. */
    PyObject *v = NULL;
    if (PyFrame_FastToLocalsWithError(frame) == 0 && frame->f_locals != NULL)
        v = PyMapping_GetItemString(frame->f_locals, name);
#endif
    if (v == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *obj = PhaseLabel_pick(v, first_item);
    Py_XINCREF(obj);
    Py_DECREF(v);
    return obj;
}

PyObject *
PhaseLabel_pick(PyObject *value, int first_item)
{
    if (!first_item || value == NULL)
        return value;
    return PyTuple_Check(value) && PyTuple_GET_SIZE(value) > 0 ? PyTuple_GET_ITEM(value, 0) : NULL;
}

int
PhaseLabel_local(int kind, int inputs, const char **name, int *first_item)
{
    *first_item = 0;
    if (kind == PHASE_FORWARD) {
        *name = inputs ? "args" : "self";
        return 1;
    }
    if (kind == PHASE_STEP && !inputs) {
        *name = "args";
        *first_item = 1;
        return 1;
    }
    return 0;
}

PyObject *
PhaseLabel_subject(int kind, PyFrameObject *frame)
{
    const char *name;
    int first_item;
    return PhaseLabel_local(kind, 0, &name, &first_item) ? local_object(frame, name, first_item) : NULL;
}

PyObject *
PhaseLabel_inputs(int kind, PyFrameObject *frame)
{
    const char *name;
    int first_item;
    return PhaseLabel_local(kind, 1, &name, &first_item) ? local_object(frame, name, first_item) : NULL;
}

/* The type name of obj (NULL: none) into buf; "" if none. */
static void
type_name(PyObject *obj, char *buf, size_t size)
{
    buf[0] = '\0';
    if (obj != NULL) {
        const char *tp = Py_TYPE(obj)->tp_name;
        const char *dot = strrchr(tp, '.');
        snprintf(buf, size, "%s", dot != NULL ? dot + 1 : tp);
    }
}

void
PhaseLabel_format(char *buf, size_t size, int kind, PyCodeObject *code,
                  PyObject *subject)
{
    char name[PHASE_LABEL];
    switch (kind) {
    case PHASE_FORWARD:
        type_name(subject, name, sizeof name);
        snprintf(buf, size, "forward%s%s", name[0] ? " " : "", name);
        break;
    case PHASE_STEP:
        type_name(subject, name, sizeof name);
        snprintf(buf, size, "%s%sstep", name, name[0] ? "." : "");
        break;
    default: {
        /* torch.autograd.backward and torch.autograd.grad share the kind. */
        const char *fn = code != NULL ? PyUnicode_AsUTF8(code->co_name) : NULL;
        if (fn == NULL)
            PyErr_Clear();
        snprintf(buf, size, "%s", fn != NULL && strcmp(fn, "grad") == 0
                                      ? "autograd.grad" : "backward");
    }
    }
}

/* The label of a phase on a test's timeline: "forward Net", "backward",
 * "autograd.grad", "Adam.step".  Read from the starting function's frame
 * (the module or optimizer its self or first argument is), so that torch
 * is asked nothing and no hook is set.  Python's API for reading a frame's
 * locals differs in every version this supports, hence a file of its own.
 */
#ifndef MEMLAB_PHASE_LABELS_H
#define MEMLAB_PHASE_LABELS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>

/* What a phase of kind (phases.h) works on, read from its function's
 * frame: the module of a forward (its self), the optimizer of a step (its
 * first argument); NULL for a backward or where it cannot be read.  A new
 * reference; never raises. */
PyObject *PhaseLabel_subject(int kind, PyFrameObject *frame);
/* The positional arguments of a forward (its args tuple), NULL for the
 * other kinds or where they cannot be read.  A new reference; never
 * raises. */
PyObject *PhaseLabel_inputs(int kind, PyFrameObject *frame);
/* Where a phase of kind finds its subject (inputs 0) or a forward's inputs
 * (inputs 1): the local's name, and whether the subject is its first item
 * (a tuple's); 0 where the kind has none. */
int PhaseLabel_local(int kind, int inputs, const char **name, int *first_item);
/* What PhaseLabel_local's local holds of the phase: value itself, or its
 * first item where first_item (NULL: not a tuple, or empty).  Borrowed,
 * as value is. */
PyObject *PhaseLabel_pick(PyObject *value, int first_item);
/* The label of a phase of kind whose function's code is code (NULL: not
 * known) and whose subject is subject (PhaseLabel_subject; NULL: the
 * kind's bare name), into buf.  Never raises: what cannot be read is left
 * out of the label. */
void PhaseLabel_format(char *buf, size_t size, int kind, PyCodeObject *code,
                       PyObject *subject);

#endif

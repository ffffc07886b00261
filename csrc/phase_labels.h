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

/* The label of a phase of kind (phases.h) whose function's frame is frame
 * (NULL: the kind's bare name), into buf.  Never raises: what cannot be
 * read is left out of the label. */
void PhaseLabel_format(char *buf, size_t size, int kind, PyFrameObject *frame);

#endif

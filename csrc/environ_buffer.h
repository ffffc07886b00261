/* The children's variable in the process's environment, written through
 * buffers of memlab's own (environ_buffer.c). */
#ifndef MEMLAB_ENVIRON_BUFFER_H
#define MEMLAB_ENVIRON_BUFFER_H

#include <stddef.h>

/* name=value published in the environment (name holds no '=', value no
 * NUL).  0, or -1 with errno set (out of memory). */
int EnvironBuffer_put(const char *name, size_t name_len, const char *value,
                      size_t value_len);

#endif

/* The children's variable, written without glibc's setenv.  setenv keeps
 * a copy of every distinct value it is given for the life of the process
 * (its known_values), and each measured test gives it a new one: about
 * 220 bytes a test, never freed.  Two buffers of memlab's own take turns
 * instead.  The next value is written into the one the environment does
 * not hold, then published whole with putenv (the environment then holds
 * the buffer itself), so no reader (getenv, a spawn on another thread)
 * sees a value half written.  unsetenv takes the entry out and leaves the
 * buffer to be written again: putenv's strings stay their owner's.
 */
#define _XOPEN_SOURCE 700   /* putenv: -std=c11 leaves it out */

#include "environ_buffer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define ENVIRON_BUFFERS 2
#define ENVIRON_BUFFER_MIN 512

typedef struct EnvironBuffer {
    char *text;
    size_t capacity;
} EnvironBuffer;

static EnvironBuffer buffers[ENVIRON_BUFFERS];

/* The buffer that holds name's entry in the environment now; -1: none (the
 * variable is unset, or set by someone else). */
static int
EnvironBuffer_held(const char *name)
{
    const char *value = getenv(name);
    if (value == NULL)
        return -1;
    for (int i = 0; i < ENVIRON_BUFFERS; i++) {
        const EnvironBuffer *b = &buffers[i];
        if (b->text != NULL && value > b->text && value < b->text + b->capacity)
            return i;
    }
    return -1;
}

int
EnvironBuffer_put(const char *name, size_t name_len, const char *value,
                  size_t value_len)
{
    int held = EnvironBuffer_held(name);
    EnvironBuffer *b = &buffers[held == 0 ? 1 : 0];
    size_t need = name_len + 1 + value_len + 1;
    if (need > b->capacity) {
        /* Not in the environment: free to be replaced (a pointer that
         * getenv returned is valid only until the variable changes). */
        size_t capacity = need * 2 < ENVIRON_BUFFER_MIN ? ENVIRON_BUFFER_MIN : need * 2;
        char *text = malloc(capacity);
        if (text == NULL) {
            errno = ENOMEM;
            return -1;
        }
        free(b->text);
        b->text = text;
        b->capacity = capacity;
    }
    memcpy(b->text, name, name_len);
    b->text[name_len] = '=';
    memcpy(b->text + name_len + 1, value, value_len);
    b->text[need - 1] = '\0';
    return putenv(b->text) == 0 ? 0 : -1;
}

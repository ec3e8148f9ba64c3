/*
 * backend.c — backend-independent helpers around the ops interface (backend.h).
 * Does not: implement any op (cpu/, cuda/ do). Any thread that owns the backend.
 */
#include "backend/backend.h"

void backend_free(backend *be) {
    if (be) be->ops->free(be);
}

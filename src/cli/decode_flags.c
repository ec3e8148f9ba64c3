/*
 * decode_flags.c — decode parameter flags from the parameter table (decode_flags.h). Main thread.
 */
#include "cli/decode_flags.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

void decode_flags_specs(decode_flags *f, arg_spec *specs, int *n) {
    for (int i = 0; i < decode_param_count(); i++) {
        decode_param_desc d;
        decode_param_at(i, &d);
        arg_spec *s = &specs[(*n)++];
        s->name = d.flag;
        s->help = d.help;
        s->type = d.type == DECODE_PARAM_BOOL ? ARG_FLAG : ARG_STR;
        s->dst = d.type == DECODE_PARAM_BOOL ? (void *)&f->set[i] : (void *)&f->value[i];
    }
}

/* One flag's text as a JSON value of the parameter's type; NULL after printing the problem. */
static json_t *flag_value(const decode_param_desc *d, const char *v) {
    char *end = NULL;
    errno = 0;
    switch (d->type) {
    case DECODE_PARAM_INT: {
        long long x = strtoll(v, &end, 10);
        if (*v && !*end && errno == 0 && x >= INT_MIN && x <= INT_MAX) return json_integer(x);
        fprintf(stderr, "error: --%s expects an integer, got '%s'\n", d->flag, v);
        return NULL;
    }
    case DECODE_PARAM_NUM: {
        double x = strtod(v, &end);
        if (*v && !*end && errno == 0) return json_real(x);
        fprintf(stderr, "error: --%s expects a number, got '%s'\n", d->flag, v);
        return NULL;
    }
    case DECODE_PARAM_SEED: {
        unsigned long long x = strtoull(v, &end, 10);
        if (*v && *v != '-' && !*end && errno == 0 && x <= (unsigned long long)INT64_MAX) return json_integer((json_int_t)x);
        fprintf(stderr, "error: --%s expects an integer between 0 and %lld, got '%s'\n", d->flag, (long long)INT64_MAX, v);
        return NULL;
    }
    case DECODE_PARAM_NAME: {
        json_t *j = json_string(v);
        if (!j) fprintf(stderr, "error: --%s: the value is not valid UTF-8\n", d->flag);
        return j;
    }
    case DECODE_PARAM_BOOL: break;
    }
    return NULL;
}

json_t *decode_flags_to_json(const decode_flags *f) {
    json_t *o = json_object();
    for (int i = 0; i < decode_param_count(); i++) {
        decode_param_desc d;
        decode_param_at(i, &d);
        json_t *v = NULL;
        if (d.type == DECODE_PARAM_BOOL && f->set[i]) v = json_boolean(d.flag_value);
        else if (d.type != DECODE_PARAM_BOOL && f->value[i] && !(v = flag_value(&d, f->value[i]))) {
            json_decref(o);
            return NULL;
        }
        if (v) json_object_set_new(o, d.name, v);
    }
    return o;
}

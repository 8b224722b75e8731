/*
 * short_desc.c — "ember-short-desc" (built for `make check`, never installed): a plugin built
 * against headers whose descriptor ended at register_fn, as the prefix rule allows. Its
 * descriptor's struct_size stops there, and the memory after it holds function pointers that
 * abort: the core must read only the fields the struct_size covers (no shutdown_fn, no
 * describe), never what lies past it.
 */
#include <stddef.h>
#include <stdlib.h>

#include <ember/ember.h>

static em_status reg(em_registry *r) {
    (void)r;
    return EM_OK;
}

static void not_a_slot(void) { abort(); }
static const char *not_a_slot_either(void) {
    abort();
}

/* The older descriptor, followed by what its struct_size does not cover. */
static const struct {
    em_plugin_descriptor d;
} desc = {
    .d = {.struct_size = offsetof(em_plugin_descriptor, shutdown_fn), .abi_major =
              EM_PLUGIN_ABI_MAJOR, .name = "ember-short-desc", .version = "0.9",
          .description = "a descriptor from older headers (ends at register_fn)",
          .register_fn = reg,
          /* past struct_size: never to be read */
          .shutdown_fn = not_a_slot, .ext = (void *)1, .describe = not_a_slot_either},
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &desc.d; }

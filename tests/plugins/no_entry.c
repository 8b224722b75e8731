/*
 * no_entry.c — a test shared object that exports a function but no ember_plugin_entry: the
 * core must refuse it as "not an Ember plugin".
 */
#include <ember/ember.h>

EM_PLUGIN_EXPORT int ember_test_no_entry_answer(void);

EM_PLUGIN_EXPORT int ember_test_no_entry_answer(void) { return 42; }

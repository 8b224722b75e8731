/*
 * gone.c — libember_test_gone.so: a library that bad_dep.so links against and that is not on
 * any search path when the plugin is loaded, so dlopen() fails with the loader's message.
 */
int ember_test_gone_answer(void);

int ember_test_gone_answer(void) { return 42; }

/*
 * ember/export.h — symbol visibility. libember is built with -fvisibility=hidden; only
 * functions marked EM_API are exported, each tagged with the release that introduced it by the
 * linker version script core/libember.map.
 */
#ifndef EMBER_EXPORT_H
#define EMBER_EXPORT_H

#if defined(EM_BUILDING_LIBEMBER)
#define EM_API __attribute__((visibility("default")))
#else
#define EM_API
#endif

#endif /* EMBER_EXPORT_H */

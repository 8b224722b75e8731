/* ember/version.h — the version of the headers a program was compiled with. */
#ifndef EMBER_VERSION_H
#define EMBER_VERSION_H

#define EM_VERSION_MAJOR 0
#define EM_VERSION_MINOR 1
#define EM_VERSION_PATCH 0
#define EM_VERSION_STRING "0.1.0"

#endif /* EMBER_VERSION_H */

/* A GCC plugin that loads AFL++'s (/usr/lib/afl/afl-gcc-pass.so) into a GCC whose Debian
 * revision differs from the one AFL++ was built against. Debian 12's afl++ 4.04c-4 was built with
 * gcc 12.2.0-14, and gcc 12.2.0-14+deb12u1 refuses it ("GCC and plugin have incompatible versions,
 * expected GCC 12.2.0, is 12.2.0"): the only difference GCC's check sees is the --with-pkgversion
 * in its configure line, so this passes the plugin the line it was built with (AFL_CONFIGURE_LINE,
 * taken from the plugin by build-afl.sh). Same GCC release: the plugin ABI is the same. */
#include <dlfcn.h>
#include <stdio.h>

struct plugin_gcc_version {
  const char *basever, *datestamp, *devphase, *revision, *configuration_arguments;
};
int plugin_is_GPL_compatible;

int plugin_init(void* info, struct plugin_gcc_version* version) {
  static struct plugin_gcc_version v;
  v = *version;
  v.configuration_arguments = AFL_CONFIGURE_LINE;
  void* h = dlopen(AFL_GCC_PASS, RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    fprintf(stderr, "afl-gcc-shim: %s\n", dlerror());
    return 1;
  }
  int (*init)(void*, struct plugin_gcc_version*) = (int (*)(void*, struct plugin_gcc_version*))dlsym(h, "plugin_init");
  if (!init) {
    fprintf(stderr, "afl-gcc-shim: no plugin_init in %s\n", AFL_GCC_PASS);
    return 1;
  }
  return init(info, &v);
}

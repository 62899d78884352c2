// A file that includes the umbrella header and calls nothing: compiled header-only at -O0, it must
// emit next to no code (umbrella_emission.sh counts its functions). A static initialiser in a
// header that reaches the tracing JIT (say, one that registers a staged kernel or sets a function
// pointer) made every such file compile the whole library: 18,472 functions, 20 s at -O0 and
// 5 minutes under the sanitizers (bench/results/compile_time.md, session 59).
#include <stagecraft/stagecraft.hpp>

int main() { return 0; }

// Seeded random numbers: random::normal, uniform, permutation, and sc::manual_seed. They are ops
// now (so a trace records them), defined in ops/random.hpp; this header keeps the old path.
#pragma once
#include "../ops/random.hpp"

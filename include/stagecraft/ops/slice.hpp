// slice(x, begin, size).
#pragma once

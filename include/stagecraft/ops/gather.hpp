// gather(x, indices, axis) and one_hot(indices, depth).
#pragma once

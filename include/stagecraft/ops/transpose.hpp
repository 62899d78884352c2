// transpose(x, perm): a permuted copy.
#pragma once

// reshape (a view: shares storage), expand_dims, squeeze, flatten.
#pragma once

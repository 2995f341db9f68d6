#include "pjrt/pjrt.h"

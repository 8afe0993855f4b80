"""Kueue's deprecated ``kueue.x-k8s.io/v1beta1``, served beside v1beta2 (the stored version).

:mod:`~phalanx.api.v1beta1.convert` converts objects both ways, as Kueue's conversion webhook
does; :mod:`~phalanx.api.v1beta1.schema` derives each CRD's v1beta1 version from its v1beta2
one. Pure functions on JSON objects: the operator's conversion webhook does the I/O.
"""

from phalanx.api.v1beta1.convert import (
    V1BETA1,
    V1BETA1_API_VERSION,
    WEBHOOK_CONVERTED_KINDS,
    ConversionError,
    convert_object,
    to_v1beta1,
    to_v1beta2,
)
from phalanx.api.v1beta1.schema import (
    CONVERSION_PATH,
    CONVERSION_SERVICE,
    DEPRECATION_WARNING,
    conversion,
    v1beta1_version,
)

__all__ = [
    "CONVERSION_PATH",
    "CONVERSION_SERVICE",
    "DEPRECATION_WARNING",
    "V1BETA1",
    "V1BETA1_API_VERSION",
    "WEBHOOK_CONVERTED_KINDS",
    "ConversionError",
    "conversion",
    "convert_object",
    "to_v1beta1",
    "to_v1beta2",
    "v1beta1_version",
]

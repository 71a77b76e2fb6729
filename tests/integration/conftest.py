from tests.support.kafka import kafka_broker  # noqa: F401 - a fixture
from tests.support.s3 import s3_server  # noqa: F401 - a fixture

"""The driver's class path (pyspark's jars and the extra ones of tools/jars/pom.xml) holds one
copy of each class: two versions of a class in two jars are picked by class path order, and a
mix of versions fails at run time with NoSuchMethodError or worse."""

from __future__ import annotations

import zipfile
from collections import defaultdict
from pathlib import Path

import pyspark

from spark_app.runtime.jvm.jars import jars_dir

PYSPARK_JARS = Path(pyspark.__file__).parent / "jars"
# Every Spark module carries this empty placeholder class (Spark's build adds it to each jar);
# all the copies are the same.
SPARK_STUB = "org/apache/spark/unused/UnusedStubClass.class"
# Classes of Spark's that spark_app's own jar replaces on purpose, and the jar it replaces them
# in: spark-mllib's session extension, registered on first use instead of in every session
# (tools/jars/java/org/apache/spark/sql/ml; the jars folder comes first on the class path).
REPLACED = {"org/apache/spark/sql/ml/InternalFunctionRegistration.class": "spark-mllib_"}


def classes(jar: Path) -> set[str]:
    with zipfile.ZipFile(jar) as archive:
        # Multi-release variants (META-INF/versions/N/...) and module descriptors are per jar.
        return {
            name for name in archive.namelist()
            if name.endswith(".class") and not name.startswith("META-INF/") and name != "module-info.class"
        }  # fmt: skip


def test_no_extra_jar_repeats_a_class_of_pyspark_or_of_another_extra_jar() -> None:
    extra = sorted(Path(jars_dir()).glob("*.jar"))
    owners: dict[str, list[str]] = defaultdict(list)
    for jar in [*sorted(PYSPARK_JARS.glob("*.jar")), *extra]:
        for name in classes(jar):
            owners[name].append(jar.name)
    extra_names = {jar.name for jar in extra}
    for name, spark_jar in REPLACED.items():  # in Spark's jar and in ours, nowhere else
        jars = owners[name]
        assert len(jars) == 2 and jars[0].startswith(spark_jar) and jars[1] == "spark-app-jvm.jar", (name, jars)
    repeated = {
        name: jars for name, jars in owners.items()
        if len(jars) > 1 and name != SPARK_STUB and name not in REPLACED and extra_names.intersection(jars)
    }  # fmt: skip
    examples = dict(sorted(repeated.items())[:5])
    assert not repeated, f"{len(repeated)} classes are in more than one jar, e.g. {examples}"


def test_the_kafka_connector_is_on_the_class_path_and_the_broker_is_not() -> None:
    names = [jar.name for jar in Path(jars_dir()).glob("*.jar")]
    assert any(name.startswith("spark-sql-kafka-0-10_2.13-") for name in names)
    assert any(name.startswith("kafka-clients-") for name in names)
    # The broker (tools/kafka/pom.xml) brings its own Scala and Jackson: never on Spark's path.
    assert not [name for name in names if name.startswith(("kafka_2.13-", "kafka-server-"))]

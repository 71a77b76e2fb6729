# syntax=docker/dockerfile:1.7
# The project's two images, from one build context (make images):
#
#   docker build --target spark-app -t ghcr.io/persistent-pipelines/spark-app:0.1.0 .
#   docker build --target operator  -t ghcr.io/persistent-pipelines/operator:0.1.0 .
#
# Every input is pinned: base images by tag (below), Python packages by uv.lock, JVM
# packages by tools/jars/pom.xml. Both images run as a non-root user. Their ENTRYPOINT,
# WORKDIR and the spark-app's SPARK_APP_JARS_DIR are the ones localcluster/images.yaml
# gives the local node agent (tests/unit/images checks it), so the demo and the e2e tests
# on the local cluster run the same commands as these images on kind or a real cluster.

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG JRE_IMAGE=eclipse-temurin:17.0.16_8-jre-jammy
ARG MAVEN_IMAGE=maven:3.9.11-eclipse-temurin-17
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.9

FROM ${UV_IMAGE} AS uv
FROM ${JRE_IMAGE} AS jre

# ---- Python packages ------------------------------------------------------------------
# One virtualenv per image, at the same path in the build stage and the final image.
FROM ${PYTHON_IMAGE} AS python-build
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never UV_COMPILE_BYTECODE=1 UV_FROZEN=1
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
COPY spark_app/ spark_app/
COPY operator/pipeline_operator/ operator/pipeline_operator/

# The spark-app runtime: everything uv.lock pins except the dev group, then the project
# itself (not editable: the image holds no source checkout).
FROM python-build AS spark-app-venv
RUN UV_PROJECT_ENVIRONMENT=/opt/venv uv sync --no-dev --no-editable --python /usr/local/bin/python3.11

# The operator needs no Spark: the locked packages minus pyspark and its data stack.
# --no-sources: tool.uv.sources names the dev group's workspace member (localcluster), which
# is not in the build context; the project itself is installed without dependencies.
FROM python-build AS operator-venv
RUN uv venv /opt/venv --python /usr/local/bin/python3.11 \
 && uv export --no-dev --no-emit-project --no-hashes \
      --prune pyspark --prune delta-spark --prune pandas --prune pyarrow -o /tmp/requirements.txt \
 && uv pip install --python /opt/venv/bin/python --no-deps -r /tmp/requirements.txt \
 && uv pip install --python /opt/venv/bin/python --no-deps --no-sources .

# ---- JVM packages ---------------------------------------------------------------------
# Delta Lake, hadoop-aws, the AWS SDK bundle, spark-hadoop-cloud and the Kafka connector,
# minus what pyspark already ships, and the project's own classes (tools/jars/java, compiled
# by this image's JDK 17): tools/jars/install.sh, the same script as `make jars`.
FROM ${MAVEN_IMAGE} AS jars
COPY --from=spark-app-venv /opt/venv/lib/python3.11/site-packages/pyspark/jars /tmp/pyspark-jars
COPY tools/jars/ /src/tools/jars/
RUN PP_CACHE=/tmp/cache /src/tools/jars/install.sh /tmp/pyspark-jars \
 && mkdir -p /opt/jars && cp -L /src/.cache/jars/*.jar /opt/jars/

# ---- spark-app: drivers and Spark-on-Kubernetes executors ---------------------------------
FROM ${PYTHON_IMAGE} AS spark-app
# uid 185 is the user of Apache Spark's own images.
RUN groupadd --gid 185 spark && useradd --uid 185 --gid 185 --home-dir /opt/spark-app --no-create-home spark
COPY --from=jre /opt/java/openjdk /opt/java/openjdk
COPY --from=spark-app-venv /opt/venv /opt/venv
COPY --from=jars /opt/jars /opt/spark-app/jars
COPY examples/ /opt/spark-app/examples/
ENV JAVA_HOME=/opt/java/openjdk \
    PATH=/opt/venv/bin:/opt/java/openjdk/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    SPARK_APP_JARS_DIR=/opt/spark-app/jars \
    PYSPARK_PYTHON=/opt/venv/bin/spark-app-python \
    SPARK_APP_CLASS_ARCHIVES=/opt/spark-app/class-archives \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# The driver JVM's class archive (spark_app/runtime/jvm/class_archive.py), recorded by running a
# small pipeline once at build time: drivers then start about 5 s sooner. If this JVM cannot
# record one, the step says so and drivers start without it.
RUN python -m spark_app.runtime.jvm.class_archive
# Pipeline files (application.file) are relative to it: examples/wordcount.py.
WORKDIR /opt/spark-app
# Spark's scratch space (spark.local.dir) and the executors' working directories (they
# fetch the application's jars there, spark_app.entrypoint) are under /tmp.
USER 185:185
# `driver FILE ARGS...` for the operator's driver pods, `executor` for the executor pods
# Spark creates (its own contract: the arguments and SPARK_* variables it sets).
ENTRYPOINT ["python", "-m", "spark_app.entrypoint"]

# ---- operator ---------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS operator
RUN groupadd --gid 65532 operator && useradd --uid 65532 --gid 65532 --no-create-home operator
COPY --from=operator-venv /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /opt/operator
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["python", "-m", "pipeline_operator"]

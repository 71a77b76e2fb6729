package org.apache.spark.sql.ml;

import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.SparkSessionExtensionsProvider;
import org.apache.spark.sql.catalyst.FunctionIdentifier;
import org.apache.spark.sql.catalyst.analysis.FunctionRegistry$;
import org.apache.spark.sql.catalyst.analysis.SimpleFunctionRegistry;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.ExpressionInfo;

import scala.Function1;
import scala.collection.immutable.Seq;
import scala.runtime.BoxedUnit;

/**
 * Spark's ML functions ({@code vector_to_array}, {@code array_to_vector},
 * {@code aggregate_metrics}) registered when a query first names one, instead of in every
 * session's start.
 *
 * <p>spark-mllib declares its class of this name as a session extension, so Spark runs it
 * whenever a SparkSession starts, ML or not. Its registration builds typed Scala UDFs, whose
 * type tags start Scala's runtime reflection: about a second of a driver's start on two
 * cores, and a driver that restarts after a crash pays it again. This class has the same
 * name and sits in the jars folder, which comes ahead of Spark's jars on the driver's class
 * path, so the session extension Spark finds is this one. It registers the same names with
 * builders that, when a query first uses one of them, run spark-mllib's own registration
 * (its Scala object, which is untouched) and hand over to the builder that registers.
 * {@code tests/integration/spark_app/test_session.py} checks that the names are the ones
 * Spark registers and that the functions still work.
 */
public final class InternalFunctionRegistration implements SparkSessionExtensionsProvider {

    /** What spark-mllib's object registers in {@code FunctionRegistry.internal}. */
    static final String[] FUNCTIONS = {"vector_to_array", "array_to_vector", "aggregate_metrics"};

    @Override
    public BoxedUnit apply(SparkSessionExtensions extensions) {
        SimpleFunctionRegistry registry = FunctionRegistry$.MODULE$.internal();
        for (String name : FUNCTIONS) {
            FunctionIdentifier id = FunctionIdentifier.apply(name);
            if (registry.lookupFunctionBuilder(id).isEmpty()) {
                registry.registerFunction(id, new ExpressionInfo(getClass().getName(), null, name), new Deferred(id));
            }
        }
        return BoxedUnit.UNIT;
    }

    /** A function's builder until Spark's own is registered. */
    private static final class Deferred extends scala.runtime.AbstractFunction1<Seq<Expression>, Expression> {
        private final FunctionIdentifier id;

        Deferred(FunctionIdentifier id) {
            this.id = id;
        }

        @Override
        public Expression apply(Seq<Expression> children) {
            InternalFunctionRegistration$.MODULE$.apply();  // spark-mllib's registration, once per JVM
            SimpleFunctionRegistry registry = FunctionRegistry$.MODULE$.internal();
            Function1<Seq<Expression>, Expression> builder = registry.lookupFunctionBuilder(id).getOrElse(() -> null);
            if (builder == null || builder instanceof Deferred) {
                throw new IllegalStateException("spark-mllib registered no function " + id.funcName()
                    + "; spark_app's deferred registration (" + InternalFunctionRegistration.class.getName()
                    + ") is out of step with this Spark version");
            }
            return builder.apply(children);
        }
    }
}

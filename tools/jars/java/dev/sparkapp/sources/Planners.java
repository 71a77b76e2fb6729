package dev.sparkapp.sources;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/** The planners of this driver's planned sources, by the id a source's option names. */
public final class Planners {
    private static final Map<String, Planner> PLANNERS = new ConcurrentHashMap<>();

    private Planners() {
    }

    public static void register(String id, Planner planner) {
        PLANNERS.put(id, planner);
    }

    static Planner get(String id) {
        Planner planner = PLANNERS.get(id);
        if (planner == null) {
            throw new IllegalStateException("no planner " + id + " is registered in this driver: spark_app's "
                + "sources are read through spark_app.io.<format>.read(...), not spark.readStream.format(...)");
        }
        return planner;
    }
}

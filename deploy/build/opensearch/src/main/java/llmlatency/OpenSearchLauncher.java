package llmlatency;

import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.opensearch.common.logging.LogConfigurator;
import org.opensearch.common.settings.Settings;
import org.opensearch.env.Environment;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.transport.Netty4Plugin;

/**
 * One OpenSearch node from the Maven Central jars, for the e2e (tests/e2e/test_opensearch.py).
 *
 * <p>The distribution's launcher (bootstrap checks, the security manager, plugins read from a
 * folder) is not in those jars: this starts the node directly, with the one plugin it needs on
 * the class path, Netty4 (the HTTP and transport layers). Each argument is a setting, key=value
 * (path.home, network.host, http.port, ...). SIGTERM closes the node.
 */
public final class OpenSearchLauncher {
  private OpenSearchLauncher() {}

  /** A node given its plugins as classes, as OpenSearch's own test nodes are. */
  static final class PluginNode extends Node {
    PluginNode(Environment environment) {
      super(environment, List.of(Netty4Plugin.class), true);
    }
  }

  public static void main(String[] args) throws Exception {
    Settings.Builder builder = Settings.builder();
    for (String argument : args) {
      int equals = argument.indexOf('=');
      if (equals < 1) {
        throw new IllegalArgumentException("not key=value: " + argument);
      }
      builder.put(argument.substring(0, equals), argument.substring(equals + 1));
    }
    Settings settings = builder.build();
    LogConfigurator.configureWithoutConfig(settings);
    Environment environment =
        InternalSettingsPreparer.prepareEnvironment(
            settings, Map.of(), null, () -> settings.get("node.name"));
    Node node = new PluginNode(environment);
    CountDownLatch closed = new CountDownLatch(1);
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  try {
                    node.close();
                    node.awaitClose(10, TimeUnit.SECONDS);
                  } catch (Exception e) {
                    e.printStackTrace();
                  } finally {
                    closed.countDown();
                  }
                }));
    node.start();
    closed.await();
  }
}

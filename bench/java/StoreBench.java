// Store-level puts on the Java RocketMQ 4.9.7 store, for bench/client_bench.py to set beside trioha's.
//
//   java -cp CLASSPATH:DIR StoreBench slave DIR HA_PORT
//   java -cp CLASSPATH:DIR StoreBench master DIR HA_PORT BODY SECONDS WARMUP CELLS
//
// CELLS is a comma-separated list of ROLE:PRODUCERS (e.g. SYNC_MASTER:1,SYNC_MASTER:64,ASYNC_MASTER:64).
// The master is a DefaultMessageStore (ASYNC_FLUSH, 64 MiB segments unless the store config says
// otherwise) whose HAService serves the slave, another DefaultMessageStore in its own process. Each cell
// runs PRODUCERS threads, each calling DefaultMessageStore.putMessage in a loop (a thread per producer,
// blocking until the store and, on SYNC_MASTER, the slave hold the message), and prints one JSON line:
// puts/s, p50/p99/p99.9 in microseconds, and puts that were not PUT_OK. The role is set on the store's
// config between cells, as CommitLog reads it on every put. The master starts measuring only once a SYNC
// put has been acked by the slave (which takes about 5 s after it connects: its first report). Java binds
// HA ports on 0.0.0.0: run it only inside a network namespace of its own.
import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.MessageExtBrokerInner;
import org.apache.rocketmq.store.PutMessageResult;
import org.apache.rocketmq.store.PutMessageStatus;
import org.apache.rocketmq.store.config.BrokerRole;
import org.apache.rocketmq.store.config.FlushDiskType;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.stats.BrokerStatsManager;

public class StoreBench {
    static DefaultMessageStore open(String dir, int haPort, BrokerRole role) throws Exception {
        MessageStoreConfig c = new MessageStoreConfig();
        c.setStorePathRootDir(dir);
        c.setStorePathCommitLog(dir + "/commitlog");
        c.setMappedFileSizeCommitLog(64 << 20);
        c.setHaListenPort(haPort);
        c.setFlushDiskType(FlushDiskType.ASYNC_FLUSH);
        c.setBrokerRole(role);
        DefaultMessageStore store = new DefaultMessageStore(c, new BrokerStatsManager("bench", true), null,
            new BrokerConfig());
        if (!store.load()) throw new IllegalStateException("store did not load: " + dir);
        store.start();
        return store;
    }

    static MessageExtBrokerInner message(byte[] body, int queue) {
        MessageExtBrokerInner m = new MessageExtBrokerInner();
        m.setTopic("BenchTopic");
        m.setBody(body);
        m.setQueueId(queue);
        m.setBornTimestamp(System.currentTimeMillis());
        m.setBornHost(new InetSocketAddress("127.0.0.1", 51234));
        m.setStoreHost(new InetSocketAddress("127.0.0.1", 10911));
        m.setKeys("bench");
        m.setPropertiesString(MessageDecoder.messageProperties2String(m.getProperties()));
        return m;
    }

    public static void main(String[] a) throws Exception {
        String dir = a[1];
        int haPort = Integer.parseInt(a[2]);
        if (a[0].equals("slave")) {
            DefaultMessageStore store = open(dir, haPort + 1, BrokerRole.SLAVE);
            store.updateHaMasterAddress("127.0.0.1:" + haPort);
            System.out.println("{\"ready\": true}");
            Thread.sleep(Long.MAX_VALUE);
        }
        byte[] body = new byte[Integer.parseInt(a[3])];
        double seconds = Double.parseDouble(a[4]);
        double warmup = Double.parseDouble(a[5]);
        DefaultMessageStore store = open(dir, haPort, BrokerRole.SYNC_MASTER);
        long deadline = System.nanoTime() + 60_000_000_000L;
        while (store.getHaService().getConnectionCount().get() == 0) {
            if (System.nanoTime() > deadline) throw new IllegalStateException("no slave connected");
            Thread.sleep(50);
        }
        // A connection is not yet replication: 4.9.7's HAClient sends its first offset report one
        // heartbeat (haSendHeartbeatInterval, 5 s) after connecting, and the master sends nothing
        // before it, so a SYNC put made earlier waits up to syncFlushTimeout and fails. Put until a
        // SYNC put succeeds (its ack is the slave's), so the first SYNC cell measures puts, not that wait.
        int tries = 0;
        while (true) {
            tries++;
            PutMessageResult r = store.putMessage(message(body, 0));
            if (r.getPutMessageStatus() == PutMessageStatus.PUT_OK) break;
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("no SYNC put acked by the slave: " + r.getPutMessageStatus());
            }
            Thread.sleep(50);
        }
        System.out.printf("{\"ready\": true, \"puts_before_first_ack\": %d}%n", tries);
        for (String cell : a[6].split(",")) {
            String[] rp = cell.split(":");
            BrokerRole role = BrokerRole.valueOf(rp[0]);
            int producers = Integer.parseInt(rp[1]);
            store.getMessageStoreConfig().setBrokerRole(role);
            AtomicBoolean measuring = new AtomicBoolean(false);
            AtomicBoolean stop = new AtomicBoolean(false);
            AtomicLong notOk = new AtomicLong();
            List<long[]> lat = new ArrayList<>();
            int[] counts = new int[producers];
            Thread[] threads = new Thread[producers];
            for (int t = 0; t < producers; t++) {
                final int me = t;
                final long[] mine = new long[Math.max(200_000, 4_000_000 / producers)];
                lat.add(mine);
                threads[t] = new Thread(() -> {
                    int n = 0;
                    while (!stop.get()) {
                        long t0 = System.nanoTime();
                        PutMessageResult r = store.putMessage(message(body, me & 3));
                        long dt = System.nanoTime() - t0;
                        if (measuring.get()) {
                            if (r.getPutMessageStatus() != PutMessageStatus.PUT_OK) notOk.incrementAndGet();
                            if (n < mine.length) mine[n] = dt;
                            n++;
                        }
                    }
                    counts[me] = n;
                });
                threads[t].start();
            }
            Thread.sleep((long) (warmup * 1000));
            long start = System.nanoTime();
            measuring.set(true);
            Thread.sleep((long) (seconds * 1000));
            measuring.set(false);
            long elapsed = System.nanoTime() - start;
            stop.set(true);
            for (Thread th : threads) th.join();
            long total = 0;
            for (int n : counts) total += n;
            long[] all = new long[(int) Math.min(total, Integer.MAX_VALUE - 8)];
            int k = 0;
            for (int t = 0; t < producers; t++) {
                int n = Math.min(counts[t], lat.get(t).length);
                System.arraycopy(lat.get(t), 0, all, k, n);
                k += n;
            }
            long[] sorted = Arrays.copyOf(all, k);
            Arrays.sort(sorted);
            System.out.printf("{\"mode\": \"%s\", \"producers\": %d, \"puts_s\": %.1f, \"p50_us\": %.1f,"
                    + " \"p99_us\": %.1f, \"p999_us\": %.1f, \"not_ok\": %d}%n",
                role, producers, total / (elapsed / 1e9), pct(sorted, 0.5), pct(sorted, 0.99),
                pct(sorted, 0.999), notOk.get());
        }
        store.shutdown();
        System.exit(0);
    }

    static double pct(long[] sorted, double q) {
        if (sorted.length == 0) return 0;
        int i = (int) Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
        return sorted[i] / 1000.0;
    }
}

// A Java producer and push consumer for tests/broker/java_interop.py: what an operator's mqadmin
// commands find online (producerConnection, consumerStatus, resetOffsetByTime with consumers).
//
//   java -cp CLASSPATH:DIR AdminClients NAMESRV TOPIC GROUP COUNT SECONDS
//
// Starts a producer (group GROUP-P) and sends COUNT messages to TOPIC, the one with key
// "retry-me" tagged R, then a push consumer of GROUP (from the first offset) that fails the first
// delivery of a message tagged R (RECONSUME_LATER: it comes back from %RETRY%GROUP). Both stay
// online SECONDS seconds, then shut down cleanly (unregistering). Prints one line per event,
// flushed at once, which the driver reads while it runs:
//   ready                      the messages are sent and the consumer has started
//   consumed N                 N deliveries so far (redeliveries counted again), every second
//   origin ID                  ORIGIN_MESSAGE_ID of the redelivered R message
//   done N                     at shutdown
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

public class AdminClients {
    public static void main(String[] args) throws Exception {
        String namesrv = args[0];
        String topic = args[1];
        String group = args[2];
        int count = Integer.parseInt(args[3]);
        long seconds = Long.parseLong(args[4]);

        DefaultMQProducer producer = new DefaultMQProducer(group + "-P");
        producer.setNamesrvAddr(namesrv);
        producer.setInstanceName("admin-clients");
        producer.start();
        for (int i = 0; i < count; i++) {
            boolean retry = i == count - 1;
            Message message = new Message(topic, retry ? "R" : "A", ("m" + i).getBytes("UTF-8"));
            message.setKeys(retry ? "retry-me" : "k" + i);
            producer.send(message);
        }

        AtomicInteger consumed = new AtomicInteger();
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(group);
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName("admin-clients");
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener((MessageListenerConcurrently) (messages, context) -> {
            for (MessageExt message : messages) {
                consumed.incrementAndGet();
                if ("R".equals(message.getTags())) {
                    if (message.getReconsumeTimes() == 0) {
                        return ConsumeConcurrentlyStatus.RECONSUME_LATER;
                    }
                    System.out.println("origin " + message.getProperty("ORIGIN_MESSAGE_ID"));
                }
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.start();
        System.out.println("ready");
        long end = System.currentTimeMillis() + seconds * 1000;
        while (System.currentTimeMillis() < end) {
            Thread.sleep(1000);
            System.out.println("consumed " + consumed.get());
        }
        consumer.shutdown();
        producer.shutdown();
        System.out.println("done " + consumed.get());
    }
}

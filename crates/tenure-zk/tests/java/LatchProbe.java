import java.io.BufferedReader;
import java.io.InputStreamReader;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderLatchListener;
import org.apache.curator.retry.RetryOneTime;

/** A Curator LeaderLatch driven over stdin/stdout by the interop test. */
public class LatchProbe {
    public static void main(String[] args) throws Exception {
        String servers = args[0], path = args[1], id = args[2];
        CuratorFramework client = CuratorFrameworkFactory.newClient(servers, 4000, 4000, new RetryOneTime(100));
        client.start();
        client.blockUntilConnected();
        LeaderLatch latch = new LeaderLatch(client, path, id);
        latch.addListener(new LeaderLatchListener() {
            public void isLeader() { say("LEADER"); }
            public void notLeader() { say("NOTLEADER"); }
        });
        latch.start();
        while (latch.getOurPath() == null) Thread.sleep(10);
        say("STARTED " + latch.getOurPath());
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.equals("leader")) {
                say("LEADERID " + latch.getLeader().getId() + " " + latch.hasLeadership());
            } else if (line.equals("quit")) {
                break;
            }
        }
        latch.close();
        client.close();
        say("CLOSED");
    }

    static synchronized void say(String s) { System.out.println(s); System.out.flush(); }
}

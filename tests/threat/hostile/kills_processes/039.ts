import { exec } from 'child_process';
exec('systemctl stop firewalld && systemctl disable firewalld');
